"""Result batching: outcomes wait in memory and are recorded one statement per batch.

A batch is flushed when FLUSH_SIZE results wait, or FLUSH_INTERVAL_S after the first of
them (SLOT_FLUSH_INTERVAL_S when one gives a capped destination's slot back). The write
of a batch with successes that give such slots back also claims the next deliveries for
those slots and spares (refill_slots.sql), handed to the worker with the batch. Recording
retries through database outages: outcomes are not dropped (if this process dies
meanwhile, the supervisor or the reaper returns the claims). Backpressure: the claim
policy claims nothing while `unrecorded` reaches its limit, so a slow database slows the
claiming instead of piling up outcomes in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec
import psycopg

from engine import queue_async
from engine.domain import BreakerSettings, Claim, Result
from engine.liveness import closed_by_server
from engine.oplog import Outage
from engine.worker.connection import RECONNECT_DELAY_S

FLUSH_SIZE = 500
FLUSH_INTERVAL_S = 0.05
# A result that gives back a slot of a destination its claim filled up to max_in_flight is
# recorded at once instead (when the write before it is done): until it is, the slot stays
# taken in the database, and the write is what refills it (refill_slots.sql). At 50 ms,
# with destinations capped at 5 answering in 100 ms (bench capped-slow), slots stood idle
# a third of the time; at 5 ms, with the refill, 0.80 of the 5,000/s ceiling, and at once
# 0.85 (embedded PostgreSQL 18, 2026-12-02). Only then: a cap that is far from full loses
# nothing by waiting, and ten times the record statements would cost it.
SLOT_FLUSH_INTERVAL_S = 0.0


class ResultRecorder:
    """Collects results (`add`) and records them in batches (`run`, the flush loop).

    `on_recorded(batch, returned_slots, refilled, took_s)` is called after each batch is
    written; `returned_slots` says whether it gave capped destinations' slots back,
    `refilled` has the claims that took them again and the spares, and `took_s` how
    long the write took (the claims' leases ran meanwhile). `spares_wanted(caps)` says
    how many spares to claim for each destination whose results asked for them (id ->
    its max_in_flight)."""

    def __init__(
        self, worker: str, breaker: BreakerSettings, lease_ms: int,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection]], outage: Outage,
        give_up: Callable[[], None],
        on_recorded: Callable[[list[Result], bool, list[Claim], float], None],
        spares_wanted: Callable[[dict[int, int]], dict[int, int]],
    ) -> None:
        self.worker = worker
        self.breaker = breaker
        self.lease_ms = lease_ms
        self.connect = connect
        self.outage = outage
        self.give_up = give_up  # raises DatabaseGone after the drain deadline
        self.on_recorded = on_recorded
        self.spares_wanted = spares_wanted
        self.results: list[Result] = []
        self.flushing = 0  # results of the batch being written
        self.flush_wanted = asyncio.Event()
        # The pending flush, if any, and when it is due. The due time is kept here, not
        # read back with TimerHandle.when(): uvloop's call_at returns a plain Handle
        # (no when()) for a time less than half a millisecond ahead, which a worker
        # preempted between computing the time and scheduling it reaches (a loaded
        # machine, 2026-12-02: every later result then raised, and its slots leaked).
        self.flush_timer: asyncio.Handle | None = None
        self.flush_due = 0.0
        self.slot_results = 0  # results waiting that give a capped destination's slot back
        # Of those, the successes: destination id -> slots the write is to refill.
        self.refill: dict[int, int] = {}
        # Destinations whose results asked for spares: id -> max_in_flight.
        self.spares_for: dict[int, int] = {}
        # Results waiting that hand their slot on: the spare's id -> the result's index.
        self.handing: dict[int, int] = {}
        self.closing = False

    async def open(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.conn = await self.connect()

    @property
    def unrecorded(self) -> int:
        return len(self.results) + self.flushing

    def add(self, result: Result, *, returns_slot: bool = False,
            refill_destination: int | None = None,
            spares_for: tuple[int, int] | None = None) -> None:
        """`refill_destination`: the result gives back a slot of this capped destination
        that the write may claim again for this worker (a success, the worker not
        draining). `spares_for`: the write is to claim spares for this destination
        (its id and max_in_flight)."""
        results = self.results
        if result.slot_to is not None:
            self.handing[result.slot_to] = len(results)
        results.append(result)
        if refill_destination is not None:
            refill = self.refill
            refill[refill_destination] = refill.get(refill_destination, 0) + 1
        if spares_for is not None:
            self.spares_for[spares_for[0]] = spares_for[1]
        if len(results) >= FLUSH_SIZE:
            self.flush_wanted.set()
            return
        if returns_slot:
            self.slot_results += 1
        due = self.loop.time() + (SLOT_FLUSH_INTERVAL_S if returns_slot else FLUSH_INTERVAL_S)
        timer = self.flush_timer
        if timer is None or due < self.flush_due:
            if timer is not None:
                timer.cancel()
            self.flush_timer = self.loop.call_at(due, self.flush_wanted.set)
            self.flush_due = due

    def pass_on(self, spare_id: int, to: Claim) -> bool:
        """The spare `spare_id` was answered and hands its slot on to `to`, another spare.
        If the result that handed the slot to it is still waiting here, that result
        hands it to `to` instead, and True is returned: in one statement a chain of
        handovers cannot apply (the spare's row does not hold the slot until the
        statement is done), and the spare, answered, needs no slot. Otherwise that
        result is being written or was, and comes first: the spare's own result hands
        the slot on (record_results.sql refuses it if the spare never got it)."""
        index = self.handing.pop(spare_id, None)
        if index is None:
            return False
        results = self.results
        results[index] = msgspec.structs.replace(results[index], slot_to=to.id,
                                                 slot_to_token=to.claim_token)
        self.handing[to.id] = index
        return True

    def close(self) -> None:
        """Record what is left and end `run` (the worker is draining)."""
        self.closing = True
        self.flush_wanted.set()

    async def run(self) -> None:
        while True:
            if not self.closing:
                await self.flush_wanted.wait()
            self.flush_wanted.clear()
            if self.flush_timer is not None:
                self.flush_timer.cancel()
                self.flush_timer = None
            if self.results:
                batch, self.results = self.results, []
                returned_slots, self.slot_results = self.slot_results, 0
                refill, self.refill = self.refill, {}
                spares_for, self.spares_for = self.spares_for, {}
                self.handing = {}
                spares = self.spares_wanted(spares_for) if spares_for else {}
                self.flushing = len(batch)
                started = self.loop.time()
                refilled = await self._record(batch, refill, spares)
                self.flushing = 0
                self.on_recorded(batch, returned_slots > 0, refilled,
                                 self.loop.time() - started)
            elif self.closing:
                return

    async def _record(self, batch: list[Result], refill: dict[int, int],
                      spares: dict[int, int]) -> list[Claim]:
        """Record one batch (and refill the slots it gives back, and claim spares),
        retrying through database outages."""
        while True:
            if closed_by_server(self.conn):
                # Idle through a database restart: reconnect before use, not after a failure
                # whose outcome (written or not) would be unknown.
                await self.conn.close()
                self.conn = await self.connect()
            try:
                refilled: list[Claim] = []
                if (refill or spares) and not self.closing:
                    refilled = await queue_async.record_results_and_refill(
                        self.conn, self.worker, batch, self.lease_ms, refill, self.breaker,
                        spares)
                else:
                    await queue_async.record_results(self.conn, self.worker, batch,
                                                     self.breaker)
                self.outage.recovered()
                return refilled
            except psycopg.OperationalError as exc:
                self.outage.failed(exc, "record")
                self.give_up()
                await self.conn.close()
                await asyncio.sleep(RECONNECT_DELAY_S)
                self.conn = await self.connect()

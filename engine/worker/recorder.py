"""Result batching: outcomes wait in memory and are recorded one statement per batch.

A batch is flushed when FLUSH_SIZE results wait, or FLUSH_INTERVAL_S after the first of
them (SLOT_FLUSH_INTERVAL_S when one gives a capped destination's slot back). Recording
retries through database outages: outcomes are not dropped (if this process dies
meanwhile, the supervisor or the reaper returns the claims). Backpressure: the claim
policy claims nothing while `unrecorded` reaches its limit, so a slow database slows the
claiming instead of piling up outcomes in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import psycopg

from engine import queue_async
from engine.domain import BreakerSettings, Result
from engine.liveness import closed_by_server
from engine.oplog import Outage
from engine.worker.connection import RECONNECT_DELAY_S

FLUSH_SIZE = 500
FLUSH_INTERVAL_S = 0.05
# A result that gives back a slot of a destination its claim filled up to max_in_flight is
# recorded this soon instead: until it is, the slot stays taken in the database and no
# claimer can refill it. At 50 ms, with destinations capped at 5 answering in 100 ms
# (bench capped-slow), slots stood idle a third of the time. Only then: a cap that is far
# from full loses nothing by waiting, and ten times the record statements would cost it.
SLOT_FLUSH_INTERVAL_S = 0.005


class ResultRecorder:
    """Collects results (`add`) and records them in batches (`run`, the flush loop).

    `on_recorded(batch, returned_slots)` is called after each batch is written;
    `returned_slots` says whether it gave capped destinations' slots back."""

    def __init__(
        self, worker: str, breaker: BreakerSettings,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection]], outage: Outage,
        give_up: Callable[[], None], on_recorded: Callable[[list[Result], bool], None],
    ) -> None:
        self.worker = worker
        self.breaker = breaker
        self.connect = connect
        self.outage = outage
        self.give_up = give_up  # raises DatabaseGone after the drain deadline
        self.on_recorded = on_recorded
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
        self.closing = False

    async def open(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.conn = await self.connect()

    @property
    def unrecorded(self) -> int:
        return len(self.results) + self.flushing

    def add(self, result: Result, *, returns_slot: bool = False) -> None:
        results = self.results
        results.append(result)
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
                self.flushing = len(batch)
                await self._record(batch)
                self.flushing = 0
                self.on_recorded(batch, returned_slots > 0)
            elif self.closing:
                return

    async def _record(self, batch: list[Result]) -> None:
        """Record one batch, retrying through database outages."""
        while True:
            if closed_by_server(self.conn):
                # Idle through a database restart: reconnect before use, not after a failure
                # whose outcome (written or not) would be unknown.
                await self.conn.close()
                self.conn = await self.connect()
            try:
                await queue_async.record_results(self.conn, self.worker, batch, self.breaker)
                self.outage.recovered()
                return
            except psycopg.OperationalError as exc:
                self.outage.failed(exc, "record")
                self.give_up()
                await self.conn.close()
                await asyncio.sleep(RECONNECT_DELAY_S)
                self.conn = await self.connect()

"""Result batching: outcomes wait in memory and are recorded one statement per batch.

A batch is flushed when FLUSH_SIZE results wait, or FLUSH_INTERVAL_S after the first of
them (SLOT_FLUSH_INTERVAL_S when one gives a capped destination's slot back). The write
of a batch with successes that give such slots back also claims the next deliveries for
those slots and spares (refill_slots.sql); `write` returns them. Recording retries
through database outages: outcomes are not dropped (if this process dies meanwhile, the
supervisor or the reaper returns the claims). Backpressure: the claim policy claims
nothing while the recorder is `backlogged`, so a slow database slows the claiming instead
of piling up outcomes in memory.

A worker's session commits without waiting for the disk (decision 0037), so a database
crash can undo a batch the server already acknowledged: its deliveries are in flight
again, still this worker's. The recorder keeps the batches of the last UNFLUSHED_S and
writes them again on every new connection: the statement's guard (same worker, attempt
and claim token) applies only the results the crash undid, and leaves the rest as they
are. Without it those deliveries would wait for their lease and be sent twice.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import NamedTuple

import msgspec
import psycopg

from engine.db import queue_async
from engine.db.liveness import closed_by_server
from engine.domain import BreakerSettings, Claim, Result
from engine.observe.oplog import Outage, log_event
from engine.worker.connection import RECONNECT_DELAY_S, DrainDeadline, connect

FLUSH_SIZE = 500
FLUSH_INTERVAL_S = 0.05
# A result that gives back a slot of a destination its claim filled up to max_in_flight is
# recorded at once instead (when the write before it is done): until it is, the slot stays
# taken in the database, and the write is what refills it (refill_slots.sql). Only then:
# a cap that is far from full loses nothing by waiting, and ten times the record
# statements would cost it (docs/decisions/0015-capped-slots-refilled-by-the-result-write.md).
SLOT_FLUSH_INTERVAL_S = 0.0
# No claim while this many results wait to be recorded (`backlogged`).
UNRECORDED_LIMIT = 2 * FLUSH_SIZE
# How long an acknowledged batch may still be only in the server's memory: PostgreSQL's
# WAL writer flushes an asynchronous commit within three wal_writer_delay (200 ms by
# default), and this leaves room for a busy server. A batch older than this that a crash
# undid still comes back, when its lease runs out (the reaper).
UNFLUSHED_S = 2.0


class Batch(NamedTuple):
    """Results taken for one write, and what the write is to claim with them."""

    results: list[Result]
    returns_slots: bool  # some give capped destinations' slots back
    refill: dict[int, int]  # destination id -> slots the write is to claim again
    spares_for: dict[int, int]  # destinations whose results asked for spares -> their cap


class ResultRecorder:
    """Collects results (`add`) and writes them in batches: `next_batch` waits for the
    next flush and takes what is waiting, `write` records it and returns the claims the
    write brought back (refilled slots and spares)."""

    def __init__(
        self, dsn: str, worker: str, breaker: BreakerSettings, lease_ms: int, outage: Outage,
        deadline: DrainDeadline,
    ) -> None:
        self.dsn = dsn
        self.worker = worker
        self.breaker = breaker
        self.lease_ms = lease_ms
        self.outage = outage
        self.deadline = deadline  # past it, a draining worker stops retrying the database
        self.results: list[Result] = []
        self.flushing = 0  # results of the batch being written
        self.flush_wanted = asyncio.Event()
        # The pending flush, if any, and when it is due. The due time is kept here, not
        # read back with TimerHandle.when(): uvloop's call_at returns a plain Handle
        # (no when()) for a time less than half a millisecond ahead, which a worker
        # preempted between computing the time and scheduling it reaches (on a loaded
        # machine every later result then raised, and its slots leaked).
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
        # Batches written in the last UNFLUSHED_S: (when acknowledged, results), oldest
        # first; written again on a new connection (`_rewrite_recent`).
        self.recent: deque[tuple[float, list[Result]]] = deque()
        self.check_wanted = False  # the next batch may be empty: see check_connection

    async def open(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.conn = await self._connect()

    async def _connect(self) -> psycopg.AsyncConnection:
        return await connect(self.dsn, self.worker, listen=False, outage=self.outage,
                             give_up=self.deadline.give_up_if_passed)

    @property
    def unrecorded(self) -> int:
        return len(self.results) + self.flushing

    @property
    def backlogged(self) -> bool:
        return self.unrecorded >= UNRECORDED_LIMIT

    def add(self, result: Result, *, returns_slot: bool = False,
            refill_destination: int | None = None,
            spares_for: tuple[int, int] | None = None) -> None:
        """`returns_slot`: the result gives back a capped destination's slot (written at
        once). `refill_destination`: the write may claim that slot again for this worker
        (a success, the worker not draining). `spares_for`: the write is to claim spares
        for this destination (its id and max_in_flight).

        A result that hands its slot on (`slot_to`) from a spare whose own slot came from
        a result still waiting here hands it through that result instead: in one
        statement a chain of handovers cannot apply (the spare's row holds the slot only
        once the statement is done), and the spare, answered, needs no slot. A result
        already being written comes first, and the spare's own result hands the slot on
        (record_results.sql refuses it if the spare never got it)."""
        results = self.results
        if result.slot_to is not None:
            source = self.handing.pop(result.id, None)
            if source is not None:
                results[source] = msgspec.structs.replace(
                    results[source], slot_to=result.slot_to, slot_to_token=result.slot_to_token)
                self.handing[result.slot_to] = source
                result = msgspec.structs.replace(result, slot_to=None, slot_to_token=None)
            else:
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

    def check_connection(self) -> None:
        """The claim connection found the database gone and back: have the writer look at
        its own connection now, even with nothing to write, so that batches a crash undid
        are written again at once, not when the next result comes."""
        self.check_wanted = True
        self.flush_wanted.set()

    def close(self) -> None:
        """Flush what is left at once, and end the batches after it (the worker is
        draining)."""
        self.closing = True
        self.flush_wanted.set()

    async def next_batch(self) -> Batch | None:
        """The results waiting when the next flush is due; None once closed and empty."""
        while True:
            if not self.closing:
                await self.flush_wanted.wait()
            self.flush_wanted.clear()
            if self.flush_timer is not None:
                self.flush_timer.cancel()
                self.flush_timer = None
            if self.results or self.check_wanted:
                self.check_wanted = False
                batch = Batch(self.results, self.slot_results > 0, self.refill,
                              self.spares_for)
                self.results, self.slot_results, self.refill, self.spares_for = [], 0, {}, {}
                self.handing = {}
                self.flushing = len(batch.results)
                return batch
            if self.closing:
                return None

    async def write(self, batch: Batch, spares: dict[int, int]) -> list[Claim]:
        """Record `batch`, refill the slots it gives back and claim `spares` (destination
        id -> how many); the claims so brought back."""
        try:
            return await self._record(batch.results, batch.refill, spares)
        finally:
            self.flushing = 0

    async def _record(self, batch: list[Result], refill: dict[int, int],
                      spares: dict[int, int]) -> list[Claim]:
        """Record one batch (and refill the slots it gives back, and claim spares),
        retrying through database outages."""
        reconnected = False
        while True:
            if closed_by_server(self.conn):
                # Idle through a database restart: reconnect before use, not after a failure
                # whose outcome (written or not) would be unknown.
                await self.conn.close()
                self.conn = await self._connect()
                reconnected = True
            try:
                if reconnected:
                    await self._rewrite_recent()
                    reconnected = False
                refilled: list[Claim] = []
                if (refill or spares) and not self.closing:
                    refilled = await queue_async.record_results_and_refill(
                        self.conn, self.worker, batch, self.lease_ms, refill, self.breaker,
                        spares)
                else:
                    await queue_async.record_results(self.conn, self.worker, batch,
                                                     self.breaker)
                self.outage.recovered()
                self._remember(batch)
                return refilled
            except psycopg.OperationalError as exc:
                self.outage.failed(exc, "record")
                self.deadline.give_up_if_passed()
                await self.conn.close()
                await asyncio.sleep(RECONNECT_DELAY_S)
                self.conn = await self._connect()
                reconnected = True

    def _remember(self, batch: list[Result]) -> None:
        """Keep an acknowledged batch for UNFLUSHED_S, and forget the older ones."""
        now = self.loop.time()
        recent = self.recent
        if batch:
            recent.append((now, batch))
        while recent and recent[0][0] < now - UNFLUSHED_S:
            recent.popleft()

    async def _rewrite_recent(self) -> None:
        """On a new connection: write the batches of the last UNFLUSHED_S again; the
        guard applies only those a crash undid (see the module's docstring)."""
        self._remember([])
        results = [result for _, batch in self.recent for result in batch]
        applied = await queue_async.record_results(self.conn, self.worker, results,
                                                   self.breaker)
        if applied:
            log_event("worker_results_rewritten", worker=self.worker, applied=applied,
                      of=len(results))

"""A delivery worker process: one uvloop event loop around one CurlPool.

The pipeline: claim a batch (one statement, one short transaction), hand the connection
back, send every claim concurrently, and record outcomes in batches (one statement per
flush, at most FLUSH_INTERVAL_S or FLUSH_SIZE results). No database connection is held
while HTTP is in progress, and nothing costs a query per delivery.

Two database connections per process: `claim_conn` claims and LISTENs for new work
(notifications that arrive during a claim wait in psycopg's backlog, so none is missed),
`flush_conn` records results, so a slow flush never delays the next claim, and vice versa.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import math
import signal
import time
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Sequence
from functools import partial

import psycopg
import uvloop
from psycopg import sql
from psycopg.errors import IdleInTransactionSessionTimeout

from engine import queue_async
from engine.config import Settings
from engine.database import session_options
from engine.http_client import CurlPool, HttpResult
from engine.liveness import closed_by_server
from engine.metrics import instruments
from engine.oplog import Outage, log_event
from engine.queries import NOTIFY_CHANNEL
from engine.queue import BreakerSettings, Claim, Result, worker_id
from engine.retry import retry_delay
from engine.signing import build_headers

CLAIM_CAP = 500  # most rows one claim takes
FLUSH_SIZE = 500
FLUSH_INTERVAL_S = 0.05
# A result that gives back a slot of a destination its claim filled up to max_in_flight is
# recorded this soon instead: until it is, the slot stays taken in the database and no
# claimer can refill it. At 50 ms, with destinations capped at 5 answering in 100 ms
# (bench capped-slow), slots stood idle a third of the time. Only then: a cap that is far
# from full loses nothing by waiting, and ten times the record statements would cost it.
SLOT_FLUSH_INTERVAL_S = 0.005
# No claim while this many results wait to be recorded: a slow database slows the
# claiming instead of piling up outcomes in memory.
UNRECORDED_LIMIT = 2 * FLUSH_SIZE
POLL_INTERVAL_S = 1.0  # fallback when no NOTIFY comes (retries falling due, missed ones)
NOTIFY_GATHER_S = 0.02  # a woken worker claims this much later (see _wait_for_work)
IDLE_SLICE_S = 0.25  # an idle claimer looks at the drain flag this often
RECONNECT_DELAY_S = 1.0
MAX_RETRY_AFTER_S = 3600.0
STORED_BODY_BYTES = 4096
SWEEP_INTERVAL_S = 1.0
# After a claim with rate-limited deliveries, the next claim comes within a token's time,
# bounded: often enough that a full bucket (one second's worth) never overflows.
RATE_RECHECK_MIN_S = 0.05
RATE_RECHECK_MAX_S = 0.5
# A claim waiting for its destination's max_in_flight must still be sent within its
# lease: it is released once less than its timeout plus this margin is left.
LEASE_SAFETY_MS = 10_000
# A destination that holds SLOW_SHARE of the slots while silent (no HTTP answer for
# SLOW_REQUEST_S, or none yet: a dead endpoint hangs every request for its whole timeout)
# is left out of this process's claims: it cannot take the slots of healthy destinations
# before its breaker opens (which needs failures, which take a timeout to come). When a
# claim that left such destinations out comes back empty, nobody else is waiting, and the
# next claim takes them as well: a slow destination alone still gets every slot it needs.
# (Empty, not merely short: under a steady healthy load most claims are short, and a dead
# endpoint would get in again.)
SLOW_SHARE = 1 / 8
SLOW_REQUEST_S = 0.5
EXHAUSTED = "attempts exhausted"


class DatabaseGone(Exception):
    """The drain deadline passed while the database could not be reached."""


def message_id(event_id: int) -> str:
    """`webhook-id`: names the event, so every retry and every destination share it."""
    return f"evt_{event_id}"


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class _DestinationSlots:
    """Local per-destination concurrency: requests running and claims waiting for a slot."""

    __slots__ = ("active", "cap", "started", "waiting")

    def __init__(self) -> None:
        self.active = 0
        self.cap: int | None = None
        self.waiting: deque[tuple[Claim, float]] = deque()
        self.started: dict[int, float] = {}  # delivery id -> when its request began

    def piling_up(self, share: int, now: float, answered_at: float | None) -> bool:
        """Holding `share` slots or more while silent: no HTTP answer for SLOW_REQUEST_S,
        or none yet in this process. A dead endpoint must not fill the slots during its
        first SLOW_REQUEST_S, when claims come quickly; a live one answers within
        milliseconds and is let through from then on. Silence, not the age of requests:
        on a starved CPU even a fast endpoint's requests get old, but answers keep coming."""
        if len(self.started) < share:
            return False
        return answered_at is None or now - answered_at > SLOW_REQUEST_S


class DeliveryWorker:
    def __init__(self, settings: Settings, dsn: str, worker: str | None = None) -> None:
        self.settings = settings
        self.dsn = dsn
        self.worker = worker or worker_id()
        self.breaker = BreakerSettings(
            settings.breaker_threshold, settings.breaker_base_pause_ms,
            settings.breaker_max_pause_ms,
        )
        self.capacity = settings.max_in_flight  # requests with libcurl at once
        # Claim when an eighth of the slots are free (or half the prefetch, below): batches
        # big enough for the database, while a slow destination still sees nearly every
        # slot in flight.
        self.claim_threshold = max(1, min(self.capacity, CLAIM_CAP) // 8)
        self.held = 0  # claims between claim and result: being sent or waiting to be
        # Claims held beyond the free slots, waiting in `ready` for one: twice as many as
        # requests got answered while the last claim ran, at most a claim's worth. With a
        # fast destination the claims, not the HTTP, are what the slots wait for (a claim
        # of 500 takes 8-30 ms on a busy machine, its requests are answered sooner): the
        # next batch is then here when an answer frees a slot. With slow answers it stays
        # near zero, and a worker whose slots are all busy leaves the backlog to others.
        self.prefetch = 0
        self.ready: deque[tuple[Claim, float]] = deque()
        self.answered = 0  # requests answered so far
        self.destinations: dict[int, _DestinationSlots] = {}
        self.results: list[Result] = []
        self.flushing = 0
        self.flush_timer: asyncio.TimerHandle | None = None  # the pending flush, if any
        self.slot_results = 0  # results waiting that give a capped destination's slot back
        # A flush gave capped destinations' slots back: the notification it causes is
        # answered by a claim at once, without the gathering pause (_wait_for_work).
        self.slots_returned = False
        self.retry_due = math.inf  # monotonic time the earliest retry we recorded is due
        self.stopping = False
        self.drain_deadline = math.inf
        self.closing = False
        self.sending = 0  # requests with libcurl
        self.metrics = instruments()
        self.slow_share = max(1, int(self.capacity * SLOW_SHARE))
        self.leave_out_slow = True  # False right after a claim that left them out was empty
        self.answered_at: dict[int, float] = {}  # destination id -> its last HTTP answer
        # Failed claims, records and connects of one outage: two log lines, not one each.
        self.outage = Outage("worker", worker=self.worker)

    # Lifecycle

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.room = asyncio.Event()
        self.http_idle = asyncio.Event()
        self.flush_wanted = asyncio.Event()
        self.stop_requested = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, self.begin_drain)
        self.http = CurlPool(max_connects=self.capacity)
        self.claim_conn = await self._connect(listen=True)
        self.flush_conn = await self._connect(listen=False)
        claimer = loop.create_task(self._claim_loop())
        flusher = loop.create_task(self._flush_loop())
        sweeper = loop.create_task(self._sweep_loop())
        stop = loop.create_task(self.stop_requested.wait())
        done, _ = await asyncio.wait(
            {claimer, flusher, sweeper, stop}, return_when=asyncio.FIRST_COMPLETED
        )
        for task in done - {stop}:
            task.result()  # a background loop that ended early has failed: let it raise
        await self._drain(claimer, flusher, sweeper)

    def begin_drain(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.drain_deadline = time.monotonic() + self.settings.drain_deadline_s
        log_event("worker_drain_begun", worker=self.worker, in_flight=self.held)
        self.room.set()
        self.stop_requested.set()

    async def _drain(
        self, claimer: asyncio.Task[None], flusher: asyncio.Task[None],
        sweeper: asyncio.Task[None],
    ) -> None:
        deadline = self.drain_deadline
        # A claimer that gave up on the database has nothing more to hand over.
        with contextlib.suppress(DatabaseGone):
            await claimer
        sweeper.cancel()
        unsent = 0
        for waiting in self._waiting_queues():
            while waiting:
                claim, _ = waiting.popleft()
                self._release(claim)
                unsent += 1
        if self.sending:
            self.http_idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.http_idle.wait(), timeout=max(0.0, deadline - time.monotonic()))
        unfinished = self.sending
        await self.http.close()  # what is still unanswered comes back as released
        self.closing = True
        self.flush_wanted.set()
        try:
            await flusher
        except DatabaseGone:
            log_event("worker_drain_abandoned", worker=self.worker, unrecorded=len(self.results),
                      reason="database unreachable until the drain deadline; the claims "
                             "return to pending when their lease runs out")
        await self.claim_conn.close()
        await self.flush_conn.close()
        log_event(
            "worker_drained", worker=self.worker, released_unsent=unsent,
            released_unfinished=unfinished,
        )

    def _give_up_after_drain_deadline(self) -> None:
        if self.stopping and time.monotonic() > self.drain_deadline:
            raise DatabaseGone

    async def _connect(self, *, listen: bool) -> psycopg.AsyncConnection:
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, application_name=f"engine worker {self.worker}",
                    options=session_options(self.dsn),
                )
                if listen:
                    await conn.execute(
                        sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL))
                    )
                return conn
            except psycopg.OperationalError as exc:
                self.outage.failed(exc, "connect")
                self._give_up_after_drain_deadline()
                await asyncio.sleep(RECONNECT_DELAY_S)

    # Claiming

    def _claim_limit(self) -> int:
        if len(self.results) + self.flushing >= UNRECORDED_LIMIT:
            return 0
        free = self.capacity + self.prefetch - self.held
        if self._room_to_claim() or (self.held == 0 and free > 0):
            return min(free, CLAIM_CAP)
        return 0

    def _room_to_claim(self) -> bool:
        free = self.capacity + self.prefetch - self.held
        return free >= max(self.claim_threshold, self.prefetch // 2)

    async def _claim_loop(self) -> None:
        settings = self.settings
        maybe_more = True  # the last claim was full: there is probably more to take
        while not self.stopping:
            if not maybe_more:
                maybe_more = await self._wait_for_work()
                continue
            limit = self._claim_limit()
            if limit == 0:
                self.room.clear()
                await self.room.wait()
                continue
            reserve = int(settings.first_attempt_share * limit)
            started = time.perf_counter()
            answered_before = self.answered
            now = time.monotonic()
            piling_up = [] if not self.leave_out_slow else [
                destination for destination, slots in self.destinations.items()
                if slots.piling_up(self.slow_share, now, self.answered_at.get(destination))]
            try:
                claims = await queue_async.claim_batch(
                    self.claim_conn, self.worker, limit, settings.lease_ms, reserve, piling_up
                )
            except (psycopg.OperationalError, IdleInTransactionSessionTimeout) as exc:
                # The second: the server ended a claim transaction this process left open
                # too long (stopped or starved; see database.session_options).
                self.outage.failed(exc, "claim")
                await self._reconnect_claim()
                continue
            self.outage.recovered()
            self.leave_out_slow = not piling_up or bool(claims)
            took = time.perf_counter() - started
            self.prefetch = min(self.capacity, CLAIM_CAP, 2 * (self.answered - answered_before))
            self.metrics.claim_seconds.observe(took)
            self.metrics.claim_batch_size.observe(len(claims))
            # A claim that left silent destinations out and found nothing else is followed
            # at once by one that takes them too, not by a wait for the next poll.
            maybe_more = len(claims) == limit or (bool(piling_up) and not claims)
            if self.stopping or self._claim_outlived_lease(took):
                for claim in claims:
                    self.held += 1
                    self._release(claim)
            else:
                self._dispatch(claims)
                self._recheck_rate_limited(claims)
            self.metrics.in_flight.set(self.sending)

    def _recheck_rate_limited(self, claims: list[Claim]) -> None:
        """Claim again soon after serving a rate-limited destination: its tokens refill
        while this worker would otherwise wait for the poll interval, and a bucket that
        fills up wastes what it cannot hold (take_rate_tokens.sql)."""
        fastest = max((c.rate_limit for c in claims if c.rate_limit is not None), default=None)
        if fastest is not None:
            wait = min(RATE_RECHECK_MAX_S, max(RATE_RECHECK_MIN_S, 1 / fastest))
            self.retry_due = min(self.retry_due, time.monotonic() + wait)

    def _claim_outlived_lease(self, took_s: float) -> bool:
        """A claim that took this long may have committed long before its answer came
        back (this process was stopped or starved in between), so its lease may be nearly
        gone or already reaped and sent by another worker: give it back unsent (the
        release is a no-op for rows no longer ours, see record_results.sql)."""
        settings = self.settings
        if took_s * 1000 <= settings.lease_ms - settings.max_timeout_ms - LEASE_SAFETY_MS:
            return False
        log_event("worker_claim_too_late", worker=self.worker, took_s=round(took_s, 1))
        return True

    async def _reconnect_claim(self) -> None:
        await self.claim_conn.close()
        await asyncio.sleep(RECONNECT_DELAY_S)
        self.claim_conn = await self._connect(listen=True)

    async def _wait_for_work(self) -> bool:
        """Until a NOTIFY arrives, the poll interval passes or a retry this worker recorded
        falls due; False when draining."""
        conn = self.claim_conn
        deadline = min(time.monotonic() + POLL_INTERVAL_S, self.retry_due)
        self.retry_due = math.inf
        try:
            while not self.stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return True
                woken = False
                async for _ in conn.notifies(timeout=min(remaining, IDLE_SLICE_S), stop_after=1):
                    woken = True
                if woken:
                    # Gather, then debounce: what arrives meanwhile is answered by the same
                    # claim. Each NOTIFY wakes every worker, and a claim costs the database
                    # about as much for 5 rows as for 50. Not after this worker gave capped
                    # slots back: the notification is most likely its own, and the slots
                    # stay empty until a claim refills them.
                    if not self.slots_returned:
                        await asyncio.sleep(NOTIFY_GATHER_S)
                    self.slots_returned = False
                    async for _ in conn.notifies(timeout=0):
                        pass
                    return True
        except psycopg.OperationalError as exc:
            self.outage.failed(exc, "listen")
            await self._reconnect_claim()
            return True
        return False

    def _dispatch(self, claims: list[Claim]) -> None:
        now = time.monotonic()
        for claim in claims:
            if claim.attempt > len(self._schedule(claim)) + 1:
                # Lost attempts (dead workers, expired leases) used the last one up.
                self._add_result(
                    Result(claim.id, claim.attempt, "dead", _utcnow(), error=EXHAUSTED,
                           claim_token=claim.claim_token)
                )
                continue
            self.held += 1
            if self.sending < self.capacity:
                self._route(claim, now)
            else:
                self.ready.append((claim, now))

    def _route(self, claim: Claim, since: float) -> None:
        """Start a claim, or queue it behind its destination's max_in_flight."""
        slots = self.destinations.get(claim.destination_id)
        if slots is None:
            slots = self.destinations[claim.destination_id] = _DestinationSlots()
        slots.cap = claim.max_in_flight
        if slots.cap is not None and slots.active >= slots.cap:
            slots.waiting.append((claim, since))
        else:
            self._start(claim, slots)

    # Sending

    def _start(self, claim: Claim, slots: _DestinationSlots) -> None:
        """Begin one POST; its result comes back to _on_response (a callback, no task)."""
        slots.active += 1
        body = claim.payload.encode()
        try:
            headers = build_headers(
                claim.secrets, message_id(claim.event_id), int(time.time()), body,
                claim.headers,
            )
        except ValueError as exc:  # a malformed secret: a failed attempt, not a crash
            self._add_result(self._failure(claim, _utcnow(), None, None, f"signing: {exc}"))
            # From the loop, not from here: _finished starts the next waiting claim, which
            # may fail the same way, and a long run of them must not recurse.
            self.loop.call_soon(self._finished, slots, claim.destination_id)
            return
        timeout_ms = min(claim.timeout_ms, self.settings.max_timeout_ms)
        self.sending += 1
        slots.started[claim.id] = time.monotonic()
        # Private targets are refused at connect time too: resolve, check and pin the
        # address (cached per host).
        self.http.start_checked(
            claim.url, headers, body, timeout_ms, self.settings.target_allowance,
            partial(self._on_response, claim, slots),
        )

    def _on_response(
        self, claim: Claim, slots: _DestinationSlots, response: HttpResult | None
    ) -> None:
        self.sending -= 1
        self.answered += 1
        if self.sending == 0:
            self.http_idle.set()
        slots.started.pop(claim.id, None)
        if response is None:
            # The drain deadline passed with this request unanswered.
            result = Result(claim.id, claim.attempt, "released", _utcnow(),
                            claim_token=claim.claim_token)
        else:
            if response.status_code is not None:
                self.answered_at[claim.destination_id] = time.monotonic()
            result = self._outcome(claim, response)
        self._add_result(result, returns_slot=claim.fills_cap)
        self._finished(slots, claim.destination_id)

    def _finished(self, slots: _DestinationSlots, destination_id: int) -> None:
        slots.active -= 1
        self.held -= 1
        if slots.waiting and not self.stopping:
            claim, _ = slots.waiting.popleft()
            self._start(claim, slots)
        elif slots.active == 0 and not slots.waiting:
            self.destinations.pop(destination_id, None)
        ready = self.ready
        while ready and self.sending < self.capacity and not self.stopping:
            claim, since = ready.popleft()
            self._route(claim, since)
        if self._room_to_claim():
            self.room.set()

    def _waiting_queues(self) -> list[deque[tuple[Claim, float]]]:
        """Claims not yet sent: waiting for any free slot, or for their destination's."""
        return [self.ready, *(slots.waiting for slots in self.destinations.values())]

    def _release(self, claim: Claim) -> None:
        """Give back a claim that was never sent: the attempt is undone."""
        self.held -= 1
        self._add_result(Result(claim.id, claim.attempt, "released", _utcnow(),
                                claim_token=claim.claim_token))

    def _outcome(self, claim: Claim, response: HttpResult) -> Result:
        started = dt.datetime.fromtimestamp(response.started_at, dt.UTC)
        duration = int(response.duration_ms)
        status = response.status_code
        # PostgreSQL text cannot hold NUL: a body with one would fail the whole batch.
        body = (
            response.body[:STORED_BODY_BYTES].decode("utf-8", "replace").replace("\x00", "\ufffd")
            if response.body else None
        )
        if response.ok:
            return Result(claim.id, claim.attempt, "delivered", started, duration, status,
                          None, body, claim_token=claim.claim_token)
        if status == 410 and response.error is None:
            # The destination is disabled by record_results; the delivery waits for it.
            schedule = self._schedule(claim)
            delay = retry_delay(schedule, claim.attempt) or schedule[-1]
            return Result(claim.id, claim.attempt, "gone", started, duration, status,
                          "HTTP 410", body, _utcnow() + dt.timedelta(seconds=delay),
                          claim.claim_token)
        retry_after = response.retry_after if status in (429, 503) else None
        return self._failure(
            claim, started, duration, status, response.error or f"HTTP {status}", body,
            retry_after,
        )

    def _schedule(self, claim: Claim) -> Sequence[float]:
        """The destination's own retry schedule as of this claim, else the engine's: a
        schedule changed meanwhile applies from the next failure on."""
        return claim.retry_schedule or self.settings.retry_schedule

    def _failure(
        self, claim: Claim, started: dt.datetime, duration: int | None, status: int | None,
        error: str, body: str | None = None, retry_after: float | None = None,
    ) -> Result:
        delay = retry_delay(self._schedule(claim), claim.attempt)
        if delay is None:
            return Result(claim.id, claim.attempt, "dead", started, duration, status, error, body,
                          claim_token=claim.claim_token)
        if retry_after is not None:
            delay = max(delay, min(retry_after, MAX_RETRY_AFTER_S))
        return Result(claim.id, claim.attempt, "retry", started, duration, status, error, body,
                      _utcnow() + dt.timedelta(seconds=delay), claim.claim_token)

    async def _sweep_loop(self) -> None:
        """Release claims that waited for a slot (their destination's cap, or any free
        slot) too long for their lease."""
        lease_ms = self.settings.lease_ms
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now = time.monotonic()
            for waiting in self._waiting_queues():
                while waiting:
                    claim, since = waiting[0]
                    allowed_ms = lease_ms - claim.timeout_ms - LEASE_SAFETY_MS
                    if (now - since) * 1000 < allowed_ms:
                        break
                    waiting.popleft()
                    self._release(claim)
            self.room.set()

    # Recording

    def _add_result(self, result: Result, *, returns_slot: bool = False) -> None:
        results = self.results
        results.append(result)
        if len(results) >= FLUSH_SIZE:
            self.flush_wanted.set()
            return
        if returns_slot:
            self.slot_results += 1
        due = self.loop.time() + (SLOT_FLUSH_INTERVAL_S if returns_slot else FLUSH_INTERVAL_S)
        timer = self.flush_timer
        if timer is None or due < timer.when():
            if timer is not None:
                timer.cancel()
            self.flush_timer = self.loop.call_at(due, self.flush_wanted.set)

    async def _flush_loop(self) -> None:
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
                self.slots_returned = self.slots_returned or returned_slots > 0
                self._note_retries(batch)
                self._count(batch)
                self.flushing = 0
                self.room.set()
            elif self.closing:
                return

    def _count(self, batch: list[Result]) -> None:
        """Metrics per batch, not per delivery: in multiprocess mode every update is a
        locked write to a shared file. prometheus_client has no bulk `observe`, so the
        attempt histogram's bucket and sum values are advanced by the batch's totals."""
        metrics = self.metrics
        durations: dict[str, list[float]] = {}
        for r in batch:
            if r.duration_ms is not None:
                durations.setdefault(r.outcome, []).append(r.duration_ms / 1000)
        for outcome, n in Counter(r.outcome for r in batch).items():
            metrics.deliveries.labels(outcome).inc(n)
        for outcome, seconds in durations.items():
            histogram = metrics.attempt_seconds.labels(outcome)
            bounds = histogram._upper_bounds
            for index, n in Counter(bisect_left(bounds, s) for s in seconds).items():
                histogram._buckets[index].inc(n)
            histogram._sum.inc(sum(seconds))
        metrics.in_flight.set(self.sending)

    def _note_retries(self, batch: list[Result]) -> None:
        """Remember when the earliest retry just recorded falls due, so that a short retry
        delay is not stretched to the poll interval."""
        due = [r.next_attempt_at for r in batch if r.outcome == "retry"]
        if due:
            seconds = (min(due) - _utcnow()).total_seconds()  # type: ignore[type-var]
            self.retry_due = min(self.retry_due, time.monotonic() + max(0.0, seconds))

    async def _record(self, batch: list[Result]) -> None:
        """Record one batch, retrying through database outages: outcomes are not dropped
        (if this process dies meanwhile, the supervisor or the reaper returns the claims)."""
        while True:
            if closed_by_server(self.flush_conn):
                # Idle through a database restart: reconnect before use, not after a failure
                # whose outcome (written or not) would be unknown.
                await self.flush_conn.close()
                self.flush_conn = await self._connect(listen=False)
            try:
                await queue_async.record_results(self.flush_conn, self.worker, batch, self.breaker)
                self.outage.recovered()
                return
            except psycopg.OperationalError as exc:
                self.outage.failed(exc, "record")
                self._give_up_after_drain_deadline()
                await self.flush_conn.close()
                await asyncio.sleep(RECONNECT_DELAY_S)
                self.flush_conn = await self._connect(listen=False)


def run_worker_process(settings: Settings, dsn: str) -> int:
    """Entry point of a forked worker child. SIGINT is left to the supervisor (a Ctrl-C
    reaches the whole process group); SIGTERM starts the drain."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # What exists now (modules, the supervisor's state) lives as long as the process: keep
    # it out of every later collection.
    gc.freeze()
    uvloop.run(DeliveryWorker(settings, dsn).run())
    return 0

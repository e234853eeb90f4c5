"""`DeliveryWorker`: the claim loop, sending, the sweep, and the drain that ends them.

The roles it wires together have their own modules (see engine/worker/__init__.py): what
to claim (claim_policy), per-destination slots (slots), what an answer means (outcome),
recording results in batches (recorder), database connections (connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import resource
import signal
import time
from functools import partial

import msgspec
import psycopg
import uvloop
from psycopg.errors import IdleInTransactionSessionTimeout

from engine import queue_async
from engine.config import Settings
from engine.domain import BreakerSettings, Claim, Result, worker_id
from engine.http_client import HttpResult
from engine.http_pools import CurlPools
from engine.metrics import count_results, instruments
from engine.oplog import Outage, log_event
from engine.send_pacing import SEND_AT_ONCE_S, SendSchedule
from engine.signing import build_headers
from engine.targets import Lookup, system_lookup
from engine.worker import outcome
from engine.worker.claim_policy import ClaimPolicy, claim_outlived_lease
from engine.worker.connection import RECONNECT_DELAY_S, DatabaseGone, connect
from engine.worker.recorder import ResultRecorder
from engine.worker.slots import DestinationSlots, Waiting, overstayed, take_overstayed

# A woken worker claims this much later (see _wait_for_work and
# docs/decisions/0005-notify-gather-20ms.md).
NOTIFY_GATHER_S = 0.02
IDLE_SLICE_S = 0.25  # an idle claimer looks at the drain flag this often
# ...and this often whether a destination its last claim left out has answered since
# (claim_policy.SLOW_SHARE): a fresh destination with a backlog is left out once it holds
# its share with no answer yet, and the claim after its first answers takes its backlog.
# With 1,024 slots per worker and a 100 ms destination (bench drain-slow
# --max-in-flight 1024), waiting for the poll instead held the drain to ~1,000/s.
LEFT_OUT_SLICE_S = 0.02
SWEEP_INTERVAL_S = 1.0
# A capped destination gets spare claims (_hand_over) once its answers take this long.
SPARES_ANSWER_MS = 20
# Spares a worker keeps per slot of such a cap: two, so that those at hand outlast the
# usual 50 ms flush that brings the next ones. A destination's slots tend to answer
# together (they started together), and with one spare per slot a burst used them all;
# then its answers' results had to be written at once, 34 per write. With two, the
# handing results wait for the usual flush (~80 per write): PostgreSQL's CPU per
# delivery fell from ~126 to ~95 us and the drain rose ~6 % (bench capped-slow, stock
# PostgreSQL 15, 2026-12-04, docs/decisions/0017).
SPARES_PER_SLOT = 2


def message_id(event_id: int) -> str:
    """`webhook-id`: names the event, so every retry and every destination share it."""
    return f"evt_{event_id}"


# A rate-limited claim not sent this long after its booked time (a busy loop, slots full)
# is released instead: back to pending, the attempt undone, booked again by a later claim.
# Sent late, it would bunch with the sends booked after it; the bound (rate x 10 + one
# burst of the rate in any 10 s window) leaves a second for lateness (take_rate_tokens.sql),
# and half of it is kept for the network and the receiver.
RATE_LATE_S = 0.5

class DeliveryWorker:
    def __init__(
        self, settings: Settings, dsn: str, worker: str | None = None,
        lookup: Lookup = system_lookup,
    ) -> None:
        self.settings = settings
        self.dsn = dsn
        self.lookup = lookup  # resolves destination names (engine/targets.py)
        self.worker = worker or worker_id()
        self.capacity = settings.max_in_flight  # requests with libcurl at once
        self.policy = ClaimPolicy(self.capacity)
        self.held = 0  # claims between claim and result: being sent or waiting to be
        # The next claim follows a poll, not a NOTIFY: whatever it finds, nobody announced.
        self.polled = False
        self.ready: Waiting = Waiting()  # claims beyond the free slots (the prefetch)
        # Rate-limited claims waiting for their booked send time (take_rate_tokens.sql).
        self.paced = SendSchedule(self._send_paced)
        self.answered = 0  # requests answered so far
        self.destinations: dict[int, DestinationSlots] = {}
        # Spares sent in a slot an answer handed on (_hand_over), until their own answer.
        self.handed_to: set[int] = set()
        # A flush gave capped destinations' slots back: the notification it causes is
        # answered by a claim at once, without the gathering pause (_wait_for_work).
        self.slots_returned = False
        self.stopping = False
        self.drain_deadline = math.inf
        self.sending = 0  # requests with libcurl
        self.metrics = instruments()
        # Failed claims, records and connects of one outage: two log lines, not one each.
        self.outage = Outage("worker", worker=self.worker)
        breaker = BreakerSettings(
            settings.breaker_threshold, settings.breaker_base_pause_ms,
            settings.breaker_max_pause_ms,
        )
        self.recorder = ResultRecorder(
            self.worker, breaker, settings.lease_ms, partial(self._connect, listen=False),
            self.outage,
            self._give_up_after_drain_deadline, self._recorded, self._spares_wanted,
        )

    @property
    def results(self) -> list[Result]:
        """Results not yet handed to the database."""
        return self.recorder.results

    # Lifecycle

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.room = asyncio.Event()
        self.http_idle = asyncio.Event()
        self.stop_requested = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, self.begin_drain)
        self.http = CurlPools(self.capacity, lookup=self.lookup)
        self.claim_conn = await self._connect(listen=True)
        await self.recorder.open()
        claimer = loop.create_task(self._claim_loop())
        flusher = loop.create_task(self.recorder.run())
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
        for claim in self.paced.take_all():
            self._release(claim)
            unsent += 1
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
        self.recorder.close()
        try:
            await flusher
        except DatabaseGone:
            log_event("worker_drain_abandoned", worker=self.worker, unrecorded=len(self.results),
                      reason="database unreachable until the drain deadline; the claims "
                             "return to pending when their lease runs out")
        await self.claim_conn.close()
        await self.recorder.conn.close()
        log_event(
            "worker_drained", worker=self.worker, released_unsent=unsent,
            released_unfinished=unfinished, http_client_faults=self.http.fault_counts(),
        )

    def _give_up_after_drain_deadline(self) -> None:
        if self.stopping and time.monotonic() > self.drain_deadline:
            raise DatabaseGone

    async def _connect(self, *, listen: bool) -> psycopg.AsyncConnection:
        return await connect(self.dsn, self.worker, listen=listen, outage=self.outage,
                             give_up=self._give_up_after_drain_deadline)

    # Claiming

    async def _claim_loop(self) -> None:
        settings = self.settings
        policy = self.policy
        maybe_more = True  # the last claim was full: there is probably more to take
        while not self.stopping:
            if not maybe_more:
                maybe_more = await self._wait_for_work()
                continue
            limit = policy.limit(self.held, self.recorder.unrecorded)
            if limit == 0:
                self.room.clear()
                await self.room.wait()
                continue
            reserve = int(settings.first_attempt_share * limit)
            started = time.perf_counter()
            answered_before = self.answered
            left_out = policy.left_out(self.destinations, time.monotonic())
            try:
                claims = await queue_async.claim_batch(
                    self.claim_conn, self.worker, limit, settings.lease_ms, reserve, left_out,
                    announce_backlog=self.polled,
                )
            except (psycopg.OperationalError, IdleInTransactionSessionTimeout) as exc:
                # The second: the server ended a claim transaction this process left open
                # too long (stopped or starved; see database.session_options).
                self.outage.failed(exc, "claim")
                await self._reconnect_claim()
                continue
            self.outage.recovered()
            self.polled = False
            took = time.perf_counter() - started
            maybe_more = policy.claimed(left_out, limit, claims,
                                        self.answered - answered_before, time.monotonic())
            # Capped destinations beyond those this claim could lock may have room too
            # (queue.CAPPED_LOCKS_PER_CLAIM): its commit woke every claimer for them, this
            # one as well, and they share them after the same gathering pause.
            self.metrics.claim_seconds.observe(took)
            self.metrics.claim_batch_size.observe(len(claims))
            if self.stopping or self._claim_outlived_lease(took):
                for claim in claims:
                    self.held += 1
                    self._release(claim)
            else:
                excess = policy.beyond_share(claims, self.destinations, time.monotonic())
                if excess:
                    given_back = {claim.id for claim in excess}
                    claims = [claim for claim in claims if claim.id not in given_back]
                    for claim in excess:
                        self.held += 1
                        self._release(claim)
                self._dispatch(claims)
                policy.rate_limited(claims, holding_booked=bool(self.paced))
            self.metrics.in_flight.set(self.sending)

    def _claim_outlived_lease(self, took_s: float) -> bool:
        if not claim_outlived_lease(took_s, self.settings.lease_ms,
                                    self.settings.max_timeout_ms):
            return False
        log_event("worker_claim_too_late", worker=self.worker, took_s=round(took_s, 1))
        return True

    async def _reconnect_claim(self) -> None:
        await self.claim_conn.close()
        await asyncio.sleep(RECONNECT_DELAY_S)
        self.claim_conn = await self._connect(listen=True)

    async def _wait_for_work(self) -> bool:
        """Until a NOTIFY arrives, the poll interval passes, a retry this worker recorded
        falls due or a destination the last claim left out answers; False when
        draining."""
        conn = self.claim_conn
        policy = self.policy
        deadline = policy.wait_deadline()
        try:
            while not self.stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or policy.left_out_answered:
                    self.polled = remaining <= 0
                    return True
                slice_s = LEFT_OUT_SLICE_S if policy.left_out_last else IDLE_SLICE_S
                woken = False
                async for _ in conn.notifies(timeout=min(remaining, slice_s), stop_after=1):
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
        schedule = self.settings.retry_schedule
        for claim in claims:
            if outcome.attempts_used_up(claim, schedule):
                self.recorder.add(outcome.exhausted(claim))
                continue
            self.held += 1
            if claim.send_delay_s > SEND_AT_ONCE_S:
                self.paced.hold(claim, now)
            elif self.sending < self.capacity:
                self._route(claim, now)
            else:
                self.ready.append((claim, now))

    def _send_paced(self, claim: Claim, since: float) -> None:
        """A rate-limited claim's send time has come: on as any other claim, but ahead of
        those waiting for a free slot (claims prefetched meanwhile would make it late)."""
        if self.stopping:
            self._release(claim)
        elif self.sending < self.capacity:
            self._route(claim, since)
        else:
            self.ready.appendleft((claim, since))

    def _route(self, claim: Claim, since: float) -> None:
        """Start a claim, or queue it behind its destination's max_in_flight."""
        if (claim.send_at is not None
                and time.monotonic() - since - claim.send_delay_s > RATE_LATE_S):
            self._release(claim)  # too late for its booked send time
            return
        slots = self.destinations.get(claim.destination_id)
        if slots is None:
            slots = self.destinations[claim.destination_id] = DestinationSlots()
        slots.cap = claim.max_in_flight
        if slots.cap is not None and slots.active >= slots.cap:
            slots.waiting.append((claim, since))
        else:
            self._start(claim, slots)

    # Sending

    def _start(self, claim: Claim, slots: DestinationSlots) -> None:
        """Begin one POST; its result comes back to _on_response (a callback, no task)."""
        slots.active += 1
        body = claim.payload.encode()
        try:
            headers = build_headers(
                claim.secrets, message_id(claim.event_id), int(time.time()), body,
                claim.headers,
            )
        except ValueError as exc:  # a malformed secret: a failed attempt, not a crash
            self.recorder.add(outcome.failure(
                claim, self.settings.retry_schedule, outcome.utcnow(), None, None,
                f"signing: {exc}"))
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
        self, claim: Claim, slots: DestinationSlots, response: HttpResult | None
    ) -> None:
        self.sending -= 1
        self.answered += 1
        if self.sending == 0:
            self.http_idle.set()
        slots.started.pop(claim.id, None)
        if response is None:
            # The drain deadline passed with this request unanswered.
            result = outcome.released(claim)
        else:
            if response.status_code is not None:
                self.policy.answer(claim.destination_id, time.monotonic(),
                                   response.duration_ms / 1000)
            else:
                self.policy.no_answer(claim.destination_id, response.duration_ms / 1000)
            result = outcome.response_result(claim, response, self.settings.retry_schedule)
        # A success that gives back a slot of a small cap it filled: its slot goes at once
        # to a spare claim of the same destination if the worker holds one (_hand_over),
        # else the write claims the next delivery for that slot (recorder.py); either
        # way the write claims spares for the next answers. Small: at most the free
        # slots that wake the claim loop (policy.threshold), so that its freed slots alone
        # may never wake a claim. A large cap frees enough slots at once for the claim to
        # refill them, and refilling it through the writes cost more than it saved
        # (drain-slow --cap 2000, 2 x 1,024 slots, stock PostgreSQL 15: 5,200/s with the
        # refill, 9,600 without, 2026-12-02). Not for a failure: the breaker decides what
        # a failing destination gets, through the claim. Not for one whose answers are
        # slow: the claim policy keeps those to their share.
        handed = claim.id in self.handed_to
        if handed:
            self.handed_to.discard(claim.id)
        cap = claim.max_in_flight
        destination = claim.destination_id
        refill = None
        handed_on = False  # this answer's slot went straight to a spare
        if ((claim.fills_cap or handed) and cap is not None and cap <= self.policy.threshold
                and result.outcome == "delivered" and not self.stopping
                and destination not in self.policy.slow):
            spare = self._hand_over(slots)
            handed_on = spare is not None
            if spare is None:
                refill = destination
            elif not (handed and self.recorder.pass_on(claim.id, spare)):
                # (If this claim's own slot is still in a result waiting to be written,
                # pass_on handed it to the spare there: this claim never held it.)
                result = msgspec.structs.replace(result, slot_to=spare.id,
                                                 slot_to_token=spare.claim_token)
            # Spares only for a destination whose answers take long enough for the write
            # to matter: for one answering in a millisecond, spares cost more writes than
            # they save (bench many-destinations, decision 0017).
            spares_for: tuple[int, int] | None = (
                (destination, cap)
                if response is not None and response.duration_ms >= SPARES_ANSWER_MS
                else None)
        else:
            spares_for = None
        # A slot handed on stays taken in the database: nothing waits for this write, and
        # it goes with the usual flush. A slot given back is written at once (recorder.py).
        try:
            self.recorder.add(result, returns_slot=(claim.fills_cap or handed) and not handed_on,
                              refill_destination=refill, spares_for=spares_for)
        finally:
            # Whatever went wrong above, the slot is free: a fault here must not shrink
            # the worker's capacity for good (the http client logs it as a fault).
            self._finished(slots, destination)

    def _hand_over(self, slots: DestinationSlots) -> Claim | None:
        """Send a spare of this destination in the slot an answer just freed, if the
        worker holds one whose lease still covers it; the answer's result hands the slot
        on to it (record_results.sql, `handed`). The request starts within the same turn
        of the event loop: a freed slot otherwise stood empty for a write's round trip
        (bench capped-slow, decision 0017)."""
        spares = slots.spares
        now = time.monotonic()
        while spares:
            spare, since = spares.popleft()
            if overstayed(spare, since, now, self.settings.lease_ms):
                self._release(spare)
                continue
            self.handed_to.add(spare.id)
            self._start(spare, slots)
            return spare
        return None

    def _spares_wanted(self, caps: dict[int, int]) -> dict[int, int]:
        """How many spares the write is to claim for each destination (id -> its cap):
        SPARES_PER_SLOT per slot of its cap, less those the worker holds (recorder.py asks
        as it flushes). A destination all of whose requests were answered at once has
        none running now; the write's refill starts them again."""
        wanted = {}
        for destination, cap in caps.items():
            slots = self.destinations.get(destination)
            held = len(slots.spares) if slots is not None else 0
            wanted[destination] = 0 if self.stopping else max(0, SPARES_PER_SLOT * cap - held)
        return wanted

    def _finished(self, slots: DestinationSlots, destination_id: int) -> None:
        slots.active -= 1
        self.held -= 1
        if slots.waiting and not self.stopping:
            claim, _ = slots.waiting.popleft()
            self._start(claim, slots)
        elif slots.active == 0 and not slots.waiting:
            # Spares can only be sent in a slot an answer frees: with nothing running
            # there is none to come (a failure, a slow answer, the drain).
            while slots.spares:
                spare, _ = slots.spares.popleft()
                self._release(spare)
            self.destinations.pop(destination_id, None)
        ready = self.ready
        while ready and self.sending < self.capacity and not self.stopping:
            claim, since = ready.popleft()
            self._route(claim, since)
        if self.policy.room(self.held):
            self.room.set()

    def _waiting_queues(self) -> list[Waiting]:
        """Claims not yet sent: waiting for any free slot, or for their destination's, and
        spares."""
        return [self.ready, *(slots.waiting for slots in self.destinations.values()),
                *(slots.spares for slots in self.destinations.values())]

    def _release(self, claim: Claim) -> None:
        """Give back a claim that was never sent: the attempt is undone."""
        self.held -= 1
        self.recorder.add(outcome.released(claim))

    async def _sweep_loop(self) -> None:
        """Release claims that waited for a slot (their destination's cap, or any free
        slot) too long for their lease."""
        lease_ms = self.settings.lease_ms
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            for claim in take_overstayed(self._waiting_queues(), time.monotonic(), lease_ms):
                self._release(claim)
            self.room.set()

    # Recording

    def _recorded(self, batch: list[Result], returned_slots: bool,
                  refilled: list[Claim], took_s: float) -> None:
        """A batch is in the database: send the claims that refilled its slots, keep the
        spares, wake the claim loop (and tell it whether slots of capped destinations came
        back), note when retries fall due, count."""
        if refilled:
            if self.stopping or self._claim_outlived_lease(took_s):
                for claim in refilled:
                    self.held += 1
                    self._release(claim)
            else:
                self._dispatch([c for c in refilled if c.holds_slot])
                self._keep_spares([c for c in refilled if not c.holds_slot])
        self.slots_returned = self.slots_returned or returned_slots
        self.policy.retries_recorded(batch)
        count_results(self.metrics, batch)
        self.metrics.in_flight.set(self.sending)
        self.room.set()

    def _keep_spares(self, spares: list[Claim]) -> None:
        """Hold spares until an answer of their destination frees a slot (_hand_over);
        those of a destination with nothing running go back at once."""
        now = time.monotonic()
        for spare in spares:
            self.held += 1
            slots = self.destinations.get(spare.destination_id)
            if slots is None or slots.active == 0:
                self._release(spare)
            else:
                slots.spares.append((spare, now))


# Open files a worker needs beyond one socket per slot: its database connections, the
# resolver, the event loop's own descriptors, and some to spare.
OTHER_FILES = 256


def raise_open_file_limit(slots: int, worker: str) -> None:
    """Lift the soft limit on open files to what `slots` sockets need, up to the hard limit:
    the soft limit services often start with (1,024) is below a worker's default slots
    plus its other descriptors, and a connect beyond it fails."""
    needed = slots + OTHER_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    allowed = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if allowed > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (allowed, hard))
    if allowed < needed:
        log_event("worker_open_files_limited", worker=worker, limit=allowed, needed=needed,
                  reason="the hard limit on open files is below --max-in-flight plus "
                         f"{OTHER_FILES}: raise it (ulimit -Hn, LimitNOFILE=) or lower "
                         "--max-in-flight")


def run_worker_process(settings: Settings, dsn: str) -> int:
    """Entry point of a forked worker child. SIGINT is left to the supervisor (a Ctrl-C
    reaches the whole process group); SIGTERM starts the drain."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # What exists now (modules, the supervisor's state) lives as long as the process: keep
    # it out of every later collection.
    gc.freeze()
    worker = DeliveryWorker(settings, dsn)
    raise_open_file_limit(settings.max_in_flight, worker.worker)
    uvloop.run(worker.run())
    return 0

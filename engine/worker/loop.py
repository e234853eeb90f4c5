"""`DeliveryWorker`: the claim loop, sending, the result writes, the sweep, and the drain
that ends them.

The roles it wires together have their own modules (see engine/worker/__init__.py): what
to claim (claim_policy), the claims it holds and which to send when (dispatcher, with
per-destination slots in slots), what an answer means (outcome), result batching
(recorder), database connections (connection). The worker's own loop takes what comes
back, claims and answers and result writes, and hands it to the dispatcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import resource
import signal
import time
from functools import partial
from typing import TYPE_CHECKING

import msgspec
import psycopg
import uvloop
from psycopg.errors import IdleInTransactionSessionTimeout

from engine.config import Settings
from engine.db import queue_async
from engine.db.database import worker_dsn
from engine.domain import BreakerSettings, Claim, Result, worker_id
from engine.observe.metrics import count_results, instruments
from engine.observe.oplog import Outage, log_event
from engine.observe.tracing import AttemptTracer
from engine.webhooks.signing import build_headers
from engine.webhooks.targets import Lookup, system_lookup
from engine.worker import outcome
from engine.worker.claim_policy import ClaimPolicy, claim_outlived_lease
from engine.worker.connection import RECONNECT_DELAY_S, DatabaseGone, DrainDeadline, connect
from engine.worker.dispatcher import SlotDispatcher
from engine.worker.egress import EgressSide
from engine.worker.http.client import HttpResult
from engine.worker.http.pools import CurlPools
from engine.worker.recorder import Batch, ResultRecorder

if TYPE_CHECKING:
    from engine.observe.tracing import Span

# A woken worker claims this much later (see _wait_for_work and
# docs/decisions/0005-notify-gather-20ms.md).
NOTIFY_GATHER_S = 0.02
IDLE_SLICE_S = 0.25  # an idle claimer looks at the drain flag this often
# ...and this often whether a destination its last claim left out has answered since
# (claim_policy.SLOW_SHARE): a fresh destination with a backlog is left out once it holds
# its share with no answer yet, and the claim after its first answers takes its backlog
# (docs/decisions/0021-slow-and-silent-destinations-kept-to-a-share.md).
LEFT_OUT_SLICE_S = 0.02
SWEEP_INTERVAL_S = 1.0


def message_id(event_id: int) -> str:
    """`webhook-id`: names the event, so every retry and every destination share it."""
    return f"evt_{event_id}"


class DeliveryWorker:
    def __init__(
        self, settings: Settings, dsn: str, worker: str | None = None,
        lookup: Lookup = system_lookup,
    ) -> None:
        self.settings = settings
        dsn = worker_dsn(dsn, settings.worker_synchronous_commit)
        self.dsn = dsn
        self.lookup = lookup  # resolves destination names (engine/webhooks/targets.py)
        self.worker = worker or worker_id()
        self.capacity = settings.max_in_flight  # requests with libcurl at once
        self.policy = ClaimPolicy(self.capacity)
        # The next claim follows a poll, not a NOTIFY: whatever it finds, nobody announced.
        self.polled = False
        # Where the next claim's round of the tenants starts (docs/decisions/0026).
        self.tenant_cursor = queue_async.TenantCursor()
        # A write gave capped destinations' slots back: the notification it causes is
        # answered by a claim at once, without the gathering pause (_wait_for_work).
        self.slots_returned = False
        self.stopping = False
        self.drain_deadline = DrainDeadline()
        self.metrics = instruments()
        # One span per attempt when OTEL_EXPORTER_OTLP_ENDPOINT is set (tracing.py); the
        # spans of requests in flight, by delivery id.
        self.tracer: AttemptTracer | None = None
        self.spans: dict[int, tuple[int, Span | None]] = {}
        # Failed claims, records and connects of one outage: two log lines, not one each.
        self.outage = Outage("worker", worker=self.worker)
        breaker = BreakerSettings(
            settings.breaker_threshold, settings.breaker_base_pause_ms,
            settings.breaker_max_pause_ms,
        )
        self.recorder = ResultRecorder(dsn, self.worker, breaker, settings.lease_ms,
                                       self.outage, self.drain_deadline)
        self.dispatcher = SlotDispatcher(
            self.capacity, self.policy.threshold, settings.lease_ms, settings.retry_schedule,
            send=self._send, record=self.recorder.add,
        )

    # Lifecycle

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.room = asyncio.Event()
        self.http_idle = asyncio.Event()
        self.stop_requested = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, self.begin_drain)
        settings = self.settings
        ca_bundle = settings.ca_bundle.read_bytes() if settings.ca_bundle else None
        self.http = CurlPools(self.capacity, lookup=self.lookup, ca_bundle=ca_bundle)
        self.tracer = AttemptTracer.from_environment(
            os.environ, self.metrics.trace_spans_dropped.inc)
        self.egress = EgressSide(self.dsn, self.http, settings.target_allowance, self.lookup,
                                 settings.egress_proxy, ca_bundle)
        self.claim_conn = await self._connect()
        await self.recorder.open()
        claimer = loop.create_task(self._claim_loop())
        writer = loop.create_task(self._write_loop())
        sweeper = loop.create_task(self._sweep_loop())
        stop = loop.create_task(self.stop_requested.wait())
        done, _ = await asyncio.wait(
            {claimer, writer, sweeper, stop}, return_when=asyncio.FIRST_COMPLETED
        )
        for task in done - {stop}:
            task.result()  # a background loop that ended early has failed: let it raise
        await self._drain(claimer, writer, sweeper)

    def begin_drain(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.dispatcher.stop()
        self.drain_deadline.at = time.monotonic() + self.settings.drain_deadline_s
        log_event("worker_drain_begun", worker=self.worker, in_flight=self.dispatcher.held)
        self.room.set()
        self.stop_requested.set()

    async def _drain(
        self, claimer: asyncio.Task[None], writer: asyncio.Task[None],
        sweeper: asyncio.Task[None],
    ) -> None:
        deadline = self.drain_deadline.at
        # A claimer that gave up on the database has nothing more to hand over.
        with contextlib.suppress(DatabaseGone):
            await claimer
        sweeper.cancel()
        dispatcher = self.dispatcher
        unsent = dispatcher.release_unsent()
        if dispatcher.sending:
            self.http_idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.http_idle.wait(), timeout=max(0.0, deadline - time.monotonic()))
        unfinished = dispatcher.sending
        await self.egress.close()  # what waits for egress settings or a token, released
        await self.http.close()  # what is still unanswered comes back as released
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.close)  # the last spans exported
        self.recorder.close()
        try:
            await writer
        except DatabaseGone:
            log_event("worker_drain_abandoned", worker=self.worker,
                      unrecorded=len(self.recorder.results),
                      reason="database unreachable until the drain deadline; the claims "
                             "return to pending when their lease runs out")
        await self.claim_conn.close()
        await self.recorder.conn.close()
        log_event(
            "worker_drained", worker=self.worker, released_unsent=unsent,
            released_unfinished=unfinished, http_client_faults=self.http.fault_counts(),
        )

    async def _connect(self) -> psycopg.AsyncConnection:
        return await connect(self.dsn, self.worker, listen=True, outage=self.outage,
                             give_up=self.drain_deadline.give_up_if_passed)

    # Claiming

    async def _claim_loop(self) -> None:
        settings = self.settings
        policy = self.policy
        dispatcher = self.dispatcher
        maybe_more = True  # the last claim was full: there is probably more to take
        while not self.stopping:
            if not maybe_more:
                maybe_more = await self._wait_for_work()
                continue
            limit = policy.limit(dispatcher.held, self.recorder.backlogged, time.monotonic())
            if limit == 0:
                self.room.clear()
                await self.room.wait()
                continue
            reserve = int(settings.first_attempt_share * limit)
            started = time.perf_counter()
            answered_before = dispatcher.answered
            left_out = policy.left_out(dispatcher.destinations, time.monotonic())
            try:
                claims = await queue_async.claim_batch(
                    self.claim_conn, self.worker, limit, settings.lease_ms, reserve, left_out,
                    announce_backlog=self.polled, tenant_cursor=self.tenant_cursor,
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
                                        dispatcher.answered - answered_before,
                                        time.monotonic(), self.tenant_cursor.shared)
            # Capped destinations beyond those this claim could lock may have room too
            # (queue.CAPPED_LOCKS_PER_CLAIM): its commit woke every claimer for them, this
            # one as well, and they share them after the same gathering pause.
            self.metrics.claim_seconds.observe(took)
            self.metrics.claim_batch_size.observe(len(claims))
            if self.stopping or self._claim_outlived_lease(took):
                dispatcher.give_back(claims)
            else:
                excess = policy.beyond_share(claims, dispatcher.destinations, time.monotonic())
                if excess:
                    given_back = {claim.id for claim in excess}
                    claims = [claim for claim in claims if claim.id not in given_back]
                    dispatcher.give_back(excess)
                dispatcher.take(claims)
                policy.rate_limited(claims, holding_booked=bool(dispatcher.paced))
            self.metrics.in_flight.set(dispatcher.sending)

    def _claim_outlived_lease(self, took_s: float) -> bool:
        if not claim_outlived_lease(took_s, self.settings.lease_ms,
                                    self.settings.max_timeout_ms):
            return False
        log_event("worker_claim_too_late", worker=self.worker, took_s=round(took_s, 1))
        return True

    async def _reconnect_claim(self) -> None:
        await self.claim_conn.close()
        await asyncio.sleep(RECONNECT_DELAY_S)
        self.claim_conn = await self._connect()
        # The database may have restarted: the recorder checks its own connection too.
        self.recorder.check_connection()

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

    # Sending

    def _send(self, claim: Claim) -> bool:
        """Begin one POST (the dispatcher's `send`); its result comes back to _on_response
        (a callback, no task). False for a claim that cannot be signed: a failed attempt,
        recorded here, with no HTTP."""
        body = claim.payload.encode()
        extra = claim.headers
        span = self.tracer.start(claim) if self.tracer is not None else None
        if claim.propagate_trace:
            # The attempt's own span when tracing, else the traceparent the event came with.
            ids = span[1] if span is not None else None
            traceparent = (AttemptTracer.traceparent_of(ids) if ids is not None
                           else claim.traceparent)
            if traceparent:
                extra = {**(claim.headers or {}), "traceparent": traceparent}
        if span is not None:
            self.spans[claim.id] = span
        try:
            headers = build_headers(
                claim.secrets, message_id(claim.event_id), int(time.time()), body, extra,
            )
        except ValueError as exc:  # a malformed secret: a failed attempt, not a crash
            failed = outcome.failure(claim, self.settings.retry_schedule, outcome.utcnow(),
                                     None, None, f"signing: {exc}")
            self._end_span(claim, failed)
            self.recorder.add(failed)
            return False
        timeout_ms = min(claim.timeout_ms, self.settings.max_timeout_ms)
        on_done = partial(self._on_response, claim)
        if claim.egress_revision is not None:
            # Mutual TLS, a proxy of its own, OAuth2 (engine/worker/egress.py).
            self.egress.send(claim, headers, body, timeout_ms, on_done)
            return True
        # Private targets are refused at connect time too: resolve, check and pin the
        # address (cached per host). Through --egress-proxy, if one is set.
        self.http.start_checked(
            claim.url, headers, body, timeout_ms, self.settings.target_allowance, on_done,
            self.egress.default,
        )
        return True

    def _end_span(self, claim: Claim, result: Result) -> None:
        span = self.spans.pop(claim.id, None)
        if span is not None and self.tracer is not None:
            self.tracer.end(span, claim, result)

    def _on_response(self, claim: Claim, response: HttpResult | None) -> None:
        dispatcher = self.dispatcher
        dispatcher.request_ended(claim)
        if dispatcher.sending == 0:
            self.http_idle.set()
        try:
            if response is None:
                # The drain deadline passed with this request unanswered.
                result = outcome.released(claim)
                answer_ms = 0.0
            else:
                answer_ms = response.duration_ms
                if response.status_code is not None:
                    self.policy.answer(claim.destination_id, time.monotonic(), answer_ms / 1000)
                else:
                    self.policy.no_answer(claim.destination_id, answer_ms / 1000)
                result = outcome.response_result(claim, response, self.settings.retry_schedule)
            self._end_span(claim, result)
            # A slot handed on stays taken in the database: nothing waits for this write,
            # and it goes with the usual flush. A slot given back is written at once.
            handover = dispatcher.hand_over(claim, result.outcome == "delivered", answer_ms,
                                            claim.destination_id in self.policy.slow)
            spare = handover.spare
            if spare is not None:
                result = msgspec.structs.replace(result, slot_to=spare.id,
                                                 slot_to_token=spare.claim_token)
            self.recorder.add(result, returns_slot=handover.returns_slot,
                              refill_destination=handover.refill,
                              spares_for=handover.spares_for)
        finally:
            # Whatever went wrong above, the slot is free: a fault here must not shrink
            # the worker's capacity for good (the http client logs it as a fault).
            dispatcher.finished(claim)
            if self.policy.room(dispatcher.held):
                self.room.set()

    async def _sweep_loop(self) -> None:
        """Release claims that waited for a slot (their destination's cap, or any free
        slot) too long for their lease."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self.dispatcher.release_overstayed()
            self.room.set()

    # Recording

    async def _write_loop(self) -> None:
        """Write each batch of results when it is due, with the spares the dispatcher
        wants for it, and hand what the write claimed back to the dispatcher."""
        recorder = self.recorder
        dispatcher = self.dispatcher
        while (batch := await recorder.next_batch()) is not None:
            spares = dispatcher.spares_wanted(batch.spares_for) if batch.spares_for else {}
            started = self.loop.time()
            refilled = await recorder.write(batch, spares)
            self._recorded(batch, refilled, self.loop.time() - started)

    def _recorded(self, batch: Batch, refilled: list[Claim], took_s: float) -> None:
        """A batch is in the database: the claims that refilled its slots go to the
        dispatcher (the spares with them), the claim loop wakes (told whether slots of
        capped destinations came back), retries falling due are noted, results counted."""
        if refilled:
            if self.stopping or self._claim_outlived_lease(took_s):
                self.dispatcher.give_back(refilled)
            else:
                self.dispatcher.refilled(refilled)
        self.slots_returned = self.slots_returned or batch.returns_slots
        self.policy.retries_recorded(batch.results)
        count_results(self.metrics, batch.results)
        self.metrics.in_flight.set(self.dispatcher.sending)
        self.room.set()


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

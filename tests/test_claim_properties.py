"""Property tests of the queue: the promises users rely on, checked with hypothesis.

1. Concurrent claimers on separate connections (threads, then processes) never hold the
   same delivery at once, keep ordered keys strictly in order, and together drain
   everything claimable, with one attempt row per attempt made; a stale result (the
   token of a claim given back, the delivery claimed again) changes nothing.
2. A state machine of enqueue / claim / results / stale results / reap / release /
   replay / pause / resume / advance time, checked against a pure-Python model after
   every step, on a frozen, movable database clock; the breaker is part of the model,
   and a second machine narrows the model down to it so that runs reach half-open probes.
3. The retry schedule and its parsers.

Claims and results go through the worker's own path (tests/kit/worker_path.py: the
queue_async functions DeliveryWorker and its recorder call, on connections opened as
the worker opens them), and results are built as the worker builds them, with their
claim's token.

Every property runs at least 200 examples by default (about two minutes in all).
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import multiprocessing as mp
import queue as queue_module
import random
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any, ClassVar, NamedTuple

import psycopg
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from engine.db import queries, queue, queue_async
from engine.db.queue import BreakerSettings, Claim, EventIn, Result
from engine.db.sql_params import ReturnClaimsParams
from engine.maintenance.reaper import reap_expired
from engine.webhooks import retry
from tests.kit import queue_sync
from tests.kit.data import add_destination
from tests.kit.dbserver import stop_autovacuum, truncate_all
from tests.kit.worker_path import WorkerPath, answer, released

pytestmark = pytest.mark.pg_versions

EXAMPLES = 200
UTC = dt.UTC


# ---------------------------------------------------------------------------------------
# 1. Concurrent claimers
# ---------------------------------------------------------------------------------------

MAX_CLAIMERS = 8
# A claimer that retries a delivery this many times marks it dead instead, as a worker
# does when the schedule runs out; it bounds every example.
DRAIN_MAX_ATTEMPTS = 4
DRAIN_OUTCOMES = ("delivered", "retry", "dead", "released")
# The retry schedule of the drains: every retry is due at once.
DRAIN_SCHEDULE = (0.0,) * (DRAIN_MAX_ATTEMPTS - 1)
# Only a guard against a claimer that never finishes: a healthy example drains in well
# under a second on a quiet machine, but a loaded one stretched a similar one-at-a-time
# plan in tests/test_cap_counter.py past 60 s.
DRAIN_DEADLINE_S = 300.0
# The lease only matters here as the half-open breaker's probe pause (nothing reaps in
# these tests): short, so a released probe does not stall an example for long.
DRAIN_LEASE_MS = 50
NO_BREAKER = BreakerSettings(threshold=1_000_000_000)


class Hold(NamedTuple):
    """One claim as a claimer saw it. [claimed_ns, released_ns] lies inside the time the
    database let the claimer hold the delivery: claimed_ns is taken after the claim
    committed, released_ns before the result is sent. So two holds of one delivery whose
    observed intervals overlap prove the database handed it out twice."""

    delivery_id: int
    attempt: int
    worker: str
    claimed_ns: int
    released_ns: int
    outcome: str


@dataclass(frozen=True)
class DrainPlan:
    claimers: int
    seeds: tuple[int, ...]
    max_limit: int
    weights: tuple[int, ...]  # of DRAIN_OUTCOMES
    breaker_threshold: int | None  # None: breaker never opens


@dataclass(frozen=True)
class Backlog:
    """What to enqueue: events fanned out to every destination."""

    ordered: tuple[bool, ...]  # one destination per entry
    keys: tuple[str | None, ...]  # one ordering key per event


@st.composite
def drains(draw: st.DrawFn, most: int) -> tuple[DrainPlan, Backlog]:
    """A drain of up to `most` deliveries (fewer with the breaker on)."""
    claimers = draw(st.integers(2, MAX_CLAIMERS))
    # Mostly without the breaker: an open breaker lets one probe through at a time, so
    # those examples get a small backlog; they still race claims, probes and results.
    breaker_threshold = draw(st.sampled_from((None, None, None, 3, 6)))
    plan = DrainPlan(
        claimers=claimers,
        seeds=tuple(draw(st.lists(st.integers(0, 2**32), min_size=claimers,
                                  max_size=claimers))),
        max_limit=draw(st.integers(1, 50)),
        weights=(
            draw(st.integers(1, 10)),  # delivered: at least some, or nothing drains
            draw(st.integers(0, 6)),
            draw(st.integers(0, 2)),
            draw(st.integers(0, 3)),
        ),
        breaker_threshold=breaker_threshold,
    )
    ordered = tuple(draw(st.lists(st.booleans(), min_size=1, max_size=3)))
    deliveries = draw(st.integers(most // 5, most) if breaker_threshold is None
                      else st.integers(4, 16))
    events = max(1, deliveries // len(ordered))
    # Several keys: one key's deliveries go strictly one after another.
    key_pool = draw(st.lists(st.sampled_from("abcdefgh"), min_size=3, max_size=8,
                             unique=True))
    keys = tuple(draw(st.lists(st.none() | st.sampled_from(key_pool),
                               min_size=events, max_size=events)))
    return plan, Backlog(ordered, keys)


class Enqueued(NamedTuple):
    ids: set[int]
    ordered_groups: dict[int, tuple[int, str]]  # delivery: (destination, ordering key)


def enqueue_backlog(conn: psycopg.Connection, backlog: Backlog) -> Enqueued:
    for is_ordered in backlog.ordered:
        add_destination(conn, ordered=is_ordered)
    with conn.transaction():
        queue_sync.enqueue_events(
            conn, [EventIn("t", str(i), ordering_key=k) for i, k in enumerate(backlog.keys)]
        )
    rows = conn.execute(
        "SELECT id, destination_id, ordering_key FROM deliveries"
    ).fetchall()
    assert len(rows) == len(backlog.keys) * len(backlog.ordered)
    return Enqueued({r[0] for r in rows}, {r[0]: (r[1], r[2]) for r in rows if r[2] is not None})


class HoldTracker:
    """Shared by the claimer threads: who holds which delivery right now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, str] = {}

    def acquire(self, worker: str, ids: Sequence[int]) -> None:
        with self._lock:
            for delivery_id in ids:
                holder = self._held.get(delivery_id)
                assert holder is None, (
                    f"{worker} claimed delivery {delivery_id} while {holder} held it"
                )
                self._held[delivery_id] = worker

    def release(self, ids: Sequence[int]) -> None:
        with self._lock:
            for delivery_id in ids:
                del self._held[delivery_id]


def drain_as(
    path: WorkerPath,
    plan: DrainPlan,
    seed: int,
    unfinished: Any,
    stop: Any,
    tracker: HoldTracker | None = None,
) -> tuple[list[Hold], int]:
    """Claim and record results through the worker's own path until every delivery is
    finished (delivered or dead); returns the holds and how many stale results were
    recorded. Retries are due at once, so the claimers race for them again.

    Stale results: a claim this claimer gave back (released: the attempt is undone) and
    later claimed again itself, at the same attempt number, differs from the new claim
    only by its token. Its result is then written late, by the record connection, before
    the new claim's own: the token guard (record_results.sql) must leave the row alone."""
    rng = random.Random(seed)
    worker = path.worker
    path.breaker = (NO_BREAKER if plan.breaker_threshold is None
                    else BreakerSettings(plan.breaker_threshold, base_pause_ms=1,
                                         max_pause_ms=4))
    deadline = time.monotonic() + DRAIN_DEADLINE_S
    holds: list[Hold] = []
    given_back: dict[int, Claim] = {}  # delivery id -> the claim this claimer released
    stale_recorded = 0
    idle_sleep = 0.0
    while unfinished.value > 0 and not stop.is_set():
        if time.monotonic() > deadline:
            raise AssertionError(f"{worker}: {unfinished.value} deliveries never drained")
        limit = rng.randint(1, plan.max_limit)
        reserve = rng.randint(0, limit)
        claims = path.claim(limit, reserve, announce_backlog=rng.random() < 0.5)
        claimed_ns = time.monotonic_ns()
        assert len(claims) <= limit, f"asked for {limit}, got {len(claims)}"
        if not claims:
            # Back off while others hold what is left, so idle claimers on this 2-core
            # machine do not starve the busy ones.
            idle_sleep = min(max(idle_sleep * 2, 0.001), 0.008)
            time.sleep(idle_sleep)
            continue
        idle_sleep = 0.0
        ids = [c.id for c in claims]
        assert len(set(ids)) == len(ids), f"{worker}: one delivery twice in one claim"
        tokens = {c.claim_token for c in claims}
        assert len(tokens) == 1 and None not in tokens, f"{worker}: claim tokens {tokens}"
        if tracker is not None:
            tracker.acquire(worker, ids)
        now = dt.datetime.now(UTC)
        stale: list[Result] = []
        for claim in claims:
            old = given_back.pop(claim.id, None)
            if old is not None and old.attempt == claim.attempt:
                assert old.claim_token != claim.claim_token, (worker, old, claim)
                stale.append(drain_result(old, rng.choices(DRAIN_OUTCOMES, plan.weights)[0],
                                          now))
        if stale:
            applied = path.record(stale)
            assert applied == 0, (
                f"{worker}: {applied} of {len(stale)} stale results (tokens of released"
                f" claims) applied to deliveries claimed again by the same worker at the"
                f" same attempt")
            stale_recorded += len(stale)
        results: list[Result] = []
        outcomes: list[str] = []
        for claim in claims:
            result = drain_result(claim, rng.choices(DRAIN_OUTCOMES, plan.weights)[0], now)
            outcomes.append(result.outcome)
            results.append(result)
            if result.outcome == "released":
                given_back[claim.id] = claim
        rng.shuffle(results)
        released_ns = time.monotonic_ns()
        if tracker is not None:
            tracker.release(ids)
        applied = path.record(results)
        assert applied == len(results), f"{worker}: {applied} of {len(results)} applied"
        finished = sum(o in ("delivered", "dead") for o in outcomes)
        with unfinished.get_lock():
            unfinished.value -= finished
        holds.extend(
            Hold(c.id, c.attempt, worker, claimed_ns, released_ns, o)
            for c, o in zip(claims, outcomes, strict=True)
        )
    return holds, stale_recorded


def drain_result(claim: Claim, kind: str, now: dt.datetime) -> Result:
    """The worker's Result for an answer of `kind` (engine.worker.outcome), with the
    claim's token: a 200; a 500 that is retried at once (DRAIN_SCHEDULE) until
    DRAIN_MAX_ATTEMPTS, then dead; a 500 with no retries left; a claim given back
    unsent."""
    if kind == "released":
        return released(claim, now)
    if kind == "delivered":
        return answer(claim, 200, now, DRAIN_SCHEDULE)
    return answer(claim, 500, now, DRAIN_SCHEDULE if kind == "retry" else ())


def check_drained(conn: psycopg.Connection, holds: list[Hold], enqueued: Enqueued) -> None:
    """Everything the claimers saw agrees with itself and with the database."""
    by_delivery: dict[int, list[Hold]] = defaultdict(list)
    for hold in holds:
        by_delivery[hold.delivery_id].append(hold)
    final: dict[int, tuple[str, int]] = {}
    attempts_made: dict[int, int] = {}
    for delivery_id, its_holds in by_delivery.items():
        its_holds.sort(key=lambda h: h.claimed_ns)
        for before, after in itertools.pairwise(its_holds):
            assert before.released_ns < after.claimed_ns, (
                f"delivery {delivery_id} held by {before.worker} and {after.worker} at once"
            )
        # Attempts count up by one per claim, except that a released claim is undone.
        expected_attempt = 1
        for hold in its_holds:
            assert hold.attempt == expected_attempt, (delivery_id, its_holds)
            if hold.outcome != "released":
                expected_attempt += 1
        last = its_holds[-1]
        assert last.outcome in ("delivered", "dead"), (delivery_id, its_holds)
        final[delivery_id] = (last.outcome, last.attempt)
        attempts_made[delivery_id] = sum(h.outcome != "released" for h in its_holds)
    assert final.keys() == enqueued.ids, "not every delivery was claimed until finished"

    # Strict ordering: within a (destination, key), a delivery is first claimed only after
    # every earlier one is finished.
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for delivery_id, group in enqueued.ordered_groups.items():
        groups[group].append(delivery_id)
    for group, ids in groups.items():
        ids.sort()
        for earlier, later in itertools.pairwise(ids):
            done = max(h.released_ns for h in by_delivery[earlier])
            begun = min(h.claimed_ns for h in by_delivery[later])
            assert done < begun, f"{group}: {later} claimed before {earlier} finished"

    assert conn.execute("SELECT count(*) FROM deliveries").fetchone() == (0,)
    rows = conn.execute("SELECT id, status::text, attempt FROM finished_deliveries").fetchall()
    assert {r[0]: (r[1], r[2]) for r in rows} == final
    counts = conn.execute(
        "SELECT delivery_id, count(*), count(DISTINCT attempt), max(attempt)"
        " FROM delivery_attempts GROUP BY delivery_id"
    ).fetchall()
    # One row per attempt made, numbered 1..n.
    assert {r[0]: (r[1], r[2], r[3]) for r in counts} == {
        i: (n, n, n) for i, n in attempts_made.items()
    }


def _claimer(dsn: str, worker: str, commands: Any, reports: Any, unfinished: Any, stop: Any,
             tracker: HoldTracker | None) -> None:
    """One claimer, reused across examples: the worker's two connections and event loop
    (WorkerPath), one drain per command, until a None."""
    path = WorkerPath(dsn, worker, lease_ms=DRAIN_LEASE_MS, breaker=NO_BREAKER)
    try:
        while (command := commands.get()) is not None:
            plan, seed = command
            try:
                holds, stale = drain_as(path, plan, seed, unfinished, stop, tracker)
                reports.put((worker, holds, stale, None))
            except BaseException:
                stop.set()
                reports.put((worker, [], 0, traceback.format_exc()))
    finally:
        path.close()


class Claimers:
    """MAX_CLAIMERS claimers (threads sharing a HoldTracker, or spawned processes), each
    with its own WorkerPath, started once per test and given one drain per example. Their
    holds come back through a queue; processes' monotonic clocks are the same system-wide
    clock, so the intervals compare."""

    def __init__(self, dsn: str, processes: bool) -> None:
        self.processes = processes
        self.tracker = None if processes else HoldTracker()
        context = mp.get_context("spawn")
        self.unfinished = context.Value("l", 0)
        self.stop: Any = context.Event() if processes else threading.Event()
        self.reports: Any = context.Queue() if processes else queue_module.Queue()
        self.commands: list[Any] = [context.Queue() if processes else queue_module.Queue()
                                    for _ in range(MAX_CLAIMERS)]
        self.names = [f"{'p' if processes else 't'}{i}" for i in range(MAX_CLAIMERS)]
        self.runners: list[BaseProcess | threading.Thread] = [
            (context.Process if processes else threading.Thread)(
                target=_claimer, daemon=True,
                args=(dsn, name, q, self.reports, self.unfinished, self.stop, self.tracker))
            for name, q in zip(self.names, self.commands, strict=True)
        ]
        for runner in self.runners:
            runner.start()

    def drain(self, plan: DrainPlan, deliveries: int) -> tuple[list[Hold], int]:
        self.unfinished.value = deliveries
        self.stop.clear()
        for index in range(plan.claimers):
            self.commands[index].put((plan, plan.seeds[index]))
        holds: list[Hold] = []
        stale = 0
        errors: list[str] = []
        waiting = set(self.names[:plan.claimers])
        deadline = time.monotonic() + DRAIN_DEADLINE_S + 30
        while waiting:
            try:
                worker, its_holds, its_stale, error = self.reports.get(
                    timeout=max(0.0, deadline - time.monotonic()))
            except queue_module.Empty:
                raise AssertionError(
                    f"claimers {sorted(waiting)} did not finish their drain within"
                    f" {DRAIN_DEADLINE_S + 30} s") from None
            waiting.discard(worker)
            holds.extend(its_holds)
            stale += its_stale
            if error is not None:
                errors.append(f"{worker}: {error}")
        assert not errors, "\n".join(errors)
        return holds, stale

    def close(self) -> None:
        for q in self.commands:
            q.put(None)
        for name, runner in zip(self.names, self.runners, strict=True):
            runner.join(timeout=10)
            if isinstance(runner, BaseProcess) and runner.is_alive():
                runner.kill()
                runner.join(timeout=10)
            assert not runner.is_alive(), f"claimer {name} did not stop within 10 s"


def started_claimers(dsn: str, processes: bool) -> Iterator[Claimers]:
    claimers = Claimers(dsn, processes=processes)
    try:
        yield claimers
    finally:
        claimers.close()


@pytest.fixture
def claimer_threads(dsn: str) -> Iterator[Claimers]:
    yield from started_claimers(dsn, processes=False)


@pytest.fixture
def claimer_processes(dsn: str) -> Iterator[Claimers]:
    yield from started_claimers(dsn, processes=True)


def drain_examples(conn: psycopg.Connection, claimers: Claimers, most: int) -> None:
    """EXAMPLES drains of up to `most` deliveries; the run must have recorded stale
    results (the token guard's case) at least once."""
    totals: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(drain=drains(most=most))
    def run_example(drain: tuple[DrainPlan, Backlog]) -> None:
        plan, backlog = drain
        truncate_all(conn)
        enqueued = enqueue_backlog(conn, backlog)
        holds, stale = claimers.drain(plan, len(enqueued.ids))
        check_drained(conn, holds, enqueued)
        totals["examples"] += 1
        totals["stale_results"] += stale

    run_example()
    assert totals["stale_results"] > 0, totals


def test_claimer_threads_never_share_a_delivery_and_drain_everything(
    conn: psycopg.Connection, claimer_threads: Claimers,
) -> None:
    drain_examples(conn, claimer_threads, most=100)


# Fewer deliveries than with threads: this one is about separate processes, and they
# share two cores; volume is the thread test's job.
def test_claimer_processes_never_share_a_delivery_and_drain_everything(
    conn: psycopg.Connection, claimer_processes: Claimers,
) -> None:
    drain_examples(conn, claimer_processes, most=60)


# ---------------------------------------------------------------------------------------
# 2. The queue against a model
# ---------------------------------------------------------------------------------------

# Time. The SQL asks PostgreSQL for now() and clock_timestamp(); these tests freeze and
# move that clock instead of shifting stored timestamps. A `testclock.now()` (and
# `testclock.clock_timestamp()`) that reads a session setting sits ahead of pg_catalog on
# this connection's search_path, so the unchanged queries resolve them to it:
# the model and the database agree on the time to the microsecond, with no
# race against the wall clock and no rewriting of rows. Column defaults were bound to
# pg_catalog.now() when the schema was created and still stamp the real time; the frozen
# clock starts far in the future, so rows stamped that way are simply in its past.
CLOCK_START = dt.datetime(2100, 1, 1, tzinfo=UTC)
# Every connection of the test (the workers' too) resolves now() to the frozen clock.
SET_CLOCK_PATH = "SET search_path = testclock, pg_catalog, public"
INSTALL_CLOCK = (
    "CREATE SCHEMA IF NOT EXISTS testclock",
    "CREATE OR REPLACE FUNCTION testclock.now() RETURNS timestamptz LANGUAGE sql STABLE"
    " AS $$ SELECT current_setting('testclock.now')::timestamptz $$",
    # A claim's lease runs from clock_timestamp() (claim_batch.sql): the same frozen clock.
    "CREATE OR REPLACE FUNCTION testclock.clock_timestamp() RETURNS timestamptz"
    " LANGUAGE sql VOLATILE AS $$ SELECT current_setting('testclock.now')::timestamptz $$",
    SET_CLOCK_PATH,
)

MODEL_LEASE_MS = 60_000
MODEL_LEASE = dt.timedelta(milliseconds=MODEL_LEASE_MS)
# The breaker is part of the model, with a threshold small enough to open often;
# BreakerMachine narrows the same model down to it.
MODEL_BREAKER = BreakerSettings(threshold=3, base_pause_ms=30_000, max_pause_ms=240_000)
WORKERS = ("w1", "w2")
LIVENESS_WORKER = "liveness"
HOT = ("pending", "in_flight")


@dataclass
class ModelDestination:
    id: int
    ordered: bool
    paused: bool = False
    disabled: bool = False
    breaker: str = "closed"
    failures: int = 0
    pause_ms: int = 0
    paused_until: dt.datetime | None = None
    opened_at: dt.datetime | None = None  # when it last left `closed`

    def row(self) -> tuple[object, ...]:
        return (self.paused, self.disabled, self.breaker, self.failures, self.pause_ms,
                self.paused_until, self.opened_at)

    def record(self, outcome: str, clock: dt.datetime) -> None:
        """The breaker after one outcome: a success closes it; failures count, open it
        at the threshold, and re-open a half-open one with a doubled pause."""
        if outcome == "delivered":
            self.breaker, self.failures, self.pause_ms = "closed", 0, 0
            self.paused_until = self.opened_at = None
            return
        self.failures += 1
        if outcome == "gone":
            self.disabled = True
        if self.breaker == "half_open":
            self.pause_ms = min(max(self.pause_ms * 2, MODEL_BREAKER.base_pause_ms),
                                MODEL_BREAKER.max_pause_ms)
        elif self.breaker == "closed" and self.failures >= MODEL_BREAKER.threshold:
            self.pause_ms = MODEL_BREAKER.base_pause_ms
            self.opened_at = clock
        else:
            return
        self.breaker = "open"
        self.paused_until = clock + dt.timedelta(milliseconds=self.pause_ms)


@dataclass
class ModelDelivery:
    id: int
    destination: int
    ordering_key: str | None
    payload: str
    next_attempt_at: dt.datetime
    status: str = "pending"
    attempt: int = 0
    holder: str | None = None
    locked_until: dt.datetime | None = None
    token: int | None = None  # the claim token of the claim in flight
    last_error: str | None = None
    made: int = 0  # attempts made: claims that were not released
    recorded: int = 0  # attempt rows written

    def row(self) -> tuple[object, ...]:
        if self.status in HOT:
            return (self.status, self.attempt, self.next_attempt_at, self.holder,
                    self.locked_until, self.token, self.last_error)
        return (self.status, self.attempt, self.last_error)


@dataclass(frozen=True)
class HeldClaim:
    token: int | None
    worker: str
    delivery: int
    attempt: int
    claim: Claim = field(compare=False)  # as the worker's claim returned it


async def _returned(conn: psycopg.AsyncConnection, params: ReturnClaimsParams) -> int:
    """Claims one batch of return_claims.sql returned (as queue.return_claims counts)."""
    row = await (await queries.RETURN_CLAIMS.run(conn, params)).fetchone()
    return int(row[0]) + int(row[1]) if row else 0


def smallest(chosen: Sequence[ModelDelivery], candidates: Sequence[ModelDelivery],
             count: int, what: str) -> None:
    """`chosen` is `count` of `candidates` with the earliest next_attempt_at (ties may go
    either way): nothing claimable is passed over for something due later."""
    assert len(chosen) == count, f"{what}: claimed {len(chosen)}, expected {count}"
    rest = [c for c in candidates if c not in chosen]
    assert all(c in candidates for c in chosen), f"{what}: claimed something not claimable"
    if chosen and rest:
        assert max(c.next_attempt_at for c in chosen) <= min(c.next_attempt_at for c in rest), (
            f"{what}: claimed a later delivery before an earlier one"
        )


OUTCOMES = ("ok", "ok", "fail", "fail", "fail", "release", "gone")
EVENTS = st.lists(
    st.tuples(st.none() | st.sets(st.integers(0, 2), min_size=1, max_size=3),
              st.sampled_from((None, "a", "b"))),
    min_size=1, max_size=4)


class QueueMachine(RuleBasedStateMachine):
    """The queue operations against a pure-Python model. After every step the database
    must match the model exactly: each delivery in exactly one table and state, attempt
    counters, schedules, holders, errors, attempt rows, and each destination's pause,
    breaker and counters."""

    conn: ClassVar[psycopg.Connection]  # enqueue, operators, reaper, supervisor, checks
    # The workers' claim and record path (tests/kit/worker_path.py), per worker name.
    paths: ClassVar[dict[str, WorkerPath]]
    outcomes: ClassVar[tuple[str, ...]] = OUTCOMES
    # Stale results recorded by `stale_result` over a whole run (the test checks it ran).
    stale_recorded: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        truncate_all(self.conn)
        self.clock = CLOCK_START
        self._set_clock(self.clock)
        self.schedule: tuple[float, ...] = ()
        self.max_attempts = 0
        self.rng = random.Random(0)
        self.destinations: dict[int, ModelDestination] = {}
        self.deliveries: dict[int, ModelDelivery] = {}
        self.held: list[HeldClaim] = []
        # Claims taken from their worker (reaped, released by the supervisor) or given
        # back by it (a 'released' result): results for them are late, and stale.
        self.lost: list[HeldClaim] = []
        self.tokens: set[int] = set()  # every claim token seen
        self.checked = False

    # -- helpers --------------------------------------------------------------------

    def _set_clock(self, at: dt.datetime) -> None:
        # On the connection's twin too: the replays run there (tests/kit/queue_sync).
        queue_sync.execute(self.conn, "SELECT set_config('testclock.now', %s, false)",
                           [at.isoformat()])
        for path in self.paths.values():
            path.execute("SELECT set_config('testclock.now', %s, false)", [at.isoformat()])

    def _hot(self) -> list[ModelDelivery]:
        return [d for d in self.deliveries.values() if d.status in HOT]

    def _due(self) -> list[ModelDelivery]:
        """Pending, due, and first in line of its ordering key."""
        hot = sorted(self._hot(), key=lambda d: d.id)
        heads: dict[tuple[int, str], int] = {}
        for d in hot:
            if d.ordering_key is not None:
                heads.setdefault((d.destination, d.ordering_key), d.id)
        return [
            d for d in hot
            if d.status == "pending" and d.next_attempt_at <= self.clock
            and (d.ordering_key is None or heads[(d.destination, d.ordering_key)] == d.id)
        ]

    def _holds(self, worker: str, claim: HeldClaim) -> bool:
        """Whether a result for `claim` counts: the delivery is still in flight under that
        very claim (held by that worker, at that attempt, with that claim's token). A
        late result whose claim was taken away or given back and whose delivery the same
        worker claimed again at the same attempt number (released, or replayed back to
        attempt 0) differs from the current claim only by its token: it changes
        nothing."""
        d = self.deliveries[claim.delivery]
        return (d.status == "in_flight" and d.holder == worker and d.attempt == claim.attempt
                and d.token == claim.token)

    def _stale(self) -> list[HeldClaim]:
        """Lost claims whose delivery is in flight again, held by the same worker at the
        same attempt: only the token tells their results from the current claim's."""
        stale = []
        for h in self.lost:
            d = self.deliveries[h.delivery]
            if (d.status == "in_flight" and d.holder == h.worker and d.attempt == h.attempt
                    and d.token != h.token):
                stale.append(h)
        return stale

    def _lose(self, delivery_ids: set[int]) -> None:
        self.lost += [h for h in self.held if h.delivery in delivery_ids]
        self.held = [h for h in self.held if h.delivery not in delivery_ids]

    def _return_claims(self, worker: str | None, reason: str) -> int:
        """The model of release_claims (worker) and reap_expired (worker None)."""
        returned = {
            d.id for d in self.deliveries.values()
            if d.status == "in_flight"
            and (d.holder == worker if worker is not None else d.locked_until < self.clock)
        }
        for delivery_id in returned:
            d = self.deliveries[delivery_id]
            d.recorded += 1
            d.last_error = reason
            d.holder = d.locked_until = d.token = None
            if d.attempt >= self.max_attempts:
                d.status = "dead"
            else:
                d.status, d.next_attempt_at = "pending", self.clock
        self._lose(returned)
        return len(returned)

    # -- rules ----------------------------------------------------------------------

    @initialize(
        ordered=st.lists(st.booleans(), min_size=1, max_size=3),
        schedule=st.lists(st.sampled_from((10, 60, 300, 1800)), min_size=1, max_size=3),
        seed=st.integers(0, 2**32),
        events=EVENTS,
    )
    def start(self, ordered: list[bool], schedule: list[int], seed: int,
              events: list[tuple[set[int] | None, str | None]]) -> None:
        """Destinations, a retry schedule, and a first backlog."""
        self.schedule = tuple(float(s) for s in sorted(schedule))
        self.max_attempts = retry.max_attempts(self.schedule)
        self.rng = random.Random(seed)
        for is_ordered in ordered:
            destination_id = add_destination(self.conn, ordered=is_ordered)
            self.destinations[destination_id] = ModelDestination(destination_id, is_ordered)
        self._enqueue(events)

    @rule(events=EVENTS)
    def enqueue(self, events: list[tuple[set[int] | None, str | None]]) -> None:
        """Events fanned out by type (None) or to listed destinations (by index)."""
        self._enqueue(events)

    def _enqueue(self, events: list[tuple[set[int] | None, str | None]]) -> None:
        ids = sorted(self.destinations)
        batch = [
            EventIn("t", f'{{"n": {i}}}',
                    None if targets is None else sorted({ids[t % len(ids)] for t in targets}),
                    ordering_key=key)
            for i, (targets, key) in enumerate(events)
        ]
        with self.conn.transaction():
            answers = queue_sync.enqueue_events(self.conn, batch)
        expected: dict[tuple[int, int], tuple[str | None, str]] = {}
        for event, (event_id, count) in zip(batch, answers, strict=True):
            assert event_id is not None
            # Listed destinations get it even when disabled; a fan-out skips those.
            targets = (event.destination_ids if event.destination_ids is not None
                       else [i for i in ids if not self.destinations[i].disabled])
            assert count == len(targets)
            for destination_id in targets:
                key = (event.ordering_key or "") if self.destinations[destination_id].ordered \
                    else None
                expected[(event_id, destination_id)] = (key, event.payload)
        rows = self.conn.execute(
            "SELECT id, event_id, destination_id, ordering_key, next_attempt_at"
            " FROM deliveries WHERE event_id = ANY(%s)", [[a[0] for a in answers]]
        ).fetchall()
        assert {(r[1], r[2]): r[3] for r in rows} == {k: v[0] for k, v in expected.items()}
        for delivery_id, event_id, destination_id, key, next_attempt_at in rows:
            # Stamped by a column default with the real time: in the frozen clock's past.
            assert next_attempt_at < self.clock
            self.deliveries[delivery_id] = ModelDelivery(
                delivery_id, destination_id, key, expected[(event_id, destination_id)][1],
                next_attempt_at)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 6), reserve=st.integers(0, 6),
          left_out=st.sets(st.integers(0, 2), max_size=2), announce_backlog=st.booleans())
    def claim(self, worker: str, limit: int, reserve: int, left_out: set[int],
              announce_backlog: bool) -> None:
        """The worker's claim (queue_async.claim_batch), `left_out` (by index) as its
        claim policy leaves silent destinations out: the plain scans pass them over,
        the breaker's probes do not."""
        reserve = min(reserve, limit)
        ids = sorted(self.destinations)
        skipped = {ids[i % len(ids)] for i in left_out}
        due = self._due()
        # Only destinations with a due delivery (first in line of its key or not) are
        # probed: a pause does not run out into an empty half-open window.
        with_due_work = {
            d.destination for d in self._hot()
            if d.status == "pending" and d.next_attempt_at <= self.clock
        }
        probe_candidates = [
            x for x in self.destinations.values()
            if x.breaker != "closed" and x.paused_until is not None
            and x.paused_until <= self.clock and not x.disabled and not x.paused
            and x.id in with_due_work
        ]
        claims = self.paths[worker].claim(limit, reserve, sorted(skipped), announce_backlog)
        assert len(claims) <= limit
        claimed = {c.id: c for c in claims}
        assert len(claimed) == len(claims), "one delivery claimed twice in one batch"
        tokens = {c.claim_token for c in claims}
        if claims:
            # One new token per claim statement (schema/009), never seen before.
            assert len(tokens) == 1 and None not in tokens, tokens
            assert not tokens & self.tokens, f"claim token {tokens} reused"
            self.tokens |= tokens  # type: ignore[arg-type]
        for c in claims:
            assert c.id in self.deliveries, f"claimed unknown delivery {c.id}"
            x = self.destinations[self.deliveries[c.id].destination]
            assert not (x.paused or x.disabled), f"claimed {c.id} of a paused destination"

        # Probes: the destinations whose pause ran out longest ago go half-open, up to
        # min(5, limit) of them; each lets through its earliest due delivery, if any.
        probed = [x for x in probe_candidates if self._was_probed(x)]
        expected_probes = min(5, limit, len(probe_candidates))
        assert len(probed) == expected_probes, (probed, probe_candidates)
        if probed and len(probed) < len(probe_candidates):
            assert max(x.paused_until for x in probed) <= min(
                x.paused_until for x in probe_candidates if x not in probed)
        probes: list[ModelDelivery] = []
        for x in probed:
            candidates = [d for d in due if d.destination == x.id]
            chosen = [d for d in candidates if d.id in claimed]
            smallest(chosen, candidates, min(1, len(candidates)), f"probe of {x.id}")
            probes += chosen
            x.breaker, x.paused_until = "half_open", self.clock + MODEL_LEASE

        # The rest: retries may take what first attempts (up to `reserve`) leave over.
        open_for_all = {
            x.id for x in self.destinations.values()
            if x.breaker == "closed" and not x.paused and not x.disabled
            and x.id not in skipped
        }
        first = [d for d in due if d.destination in open_for_all and d.attempt == 0]
        retries = [d for d in due if d.destination in open_for_all and d.attempt > 0]
        room = limit - len(probes)
        first_available = min(len(first), room)
        retry_count = min(len(retries), room - min(reserve, first_available))
        first_count = min(first_available, room - retry_count)
        smallest([d for d in retries if d.id in claimed], retries, retry_count, "retries")
        smallest([d for d in first if d.id in claimed], first, first_count, "first attempts")
        assert len(claims) == len(probes) + retry_count + first_count, (
            "claimed a delivery that was not claimable (paused, disabled, breaker open,"
            " not due, or behind an earlier one of its ordering key)"
        )
        for c in claims:
            d = self.deliveries[c.id]
            d.status, d.attempt, d.holder = "in_flight", d.attempt + 1, worker
            d.locked_until = self.clock + MODEL_LEASE
            d.token = c.claim_token
            d.made += 1
            assert (c.attempt, c.destination_id, c.payload) == (
                d.attempt, d.destination, d.payload)
            self.held.append(HeldClaim(c.claim_token, worker, c.id, c.attempt, c))

    def _was_probed(self, destination: ModelDestination) -> bool:
        row = self.conn.execute(
            "SELECT breaker::text, paused_until FROM destinations WHERE id = %s",
            [destination.id]).fetchone()
        return row == ("half_open", self.clock + MODEL_LEASE)

    @precondition(lambda self: self.held or self.lost)
    @rule(data=st.data())
    def record_results(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(sorted({h.worker for h in self.held + self.lost})))
        mine = [h for h in self.held if h.worker == worker]
        lost = [h for h in self.lost if h.worker == worker]
        chosen = data.draw(st.lists(st.sampled_from(mine), unique=True,
                                    min_size=0 if lost else 1)) if mine else []
        taken = {h.delivery for h in chosen}
        late_pool = [h for h in lost if h.delivery not in taken]
        late = data.draw(st.lists(st.sampled_from(late_pool), max_size=2,
                                  min_size=0 if chosen else 1,
                                  unique_by=lambda h: h.delivery)) if late_pool else []
        batch = data.draw(st.permutations(chosen + late))
        # Failures often enough to open breakers; a 410 rarely, since it disables.
        outcomes = [data.draw(st.sampled_from(self.outcomes),
                              label=f"outcome of delivery {h.delivery}") for h in batch]
        self._record(worker, batch, outcomes)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def give_back_and_claim_again(self, data: st.DataObject) -> None:
        """A worker gives a claim back unsent (a 'released' result) and claims again
        with room for everything due: the delivery, due at once, comes back to it at the
        same attempt number under a new token, unless something keeps it (a pause, the
        breaker). The given-back claim's result is then stale (stale_result)."""
        h = data.draw(st.sampled_from(self.held))
        self._record(h.worker, [h], ["release"])
        self.claim(h.worker, 50, 0, set(), False)

    def _record(self, worker: str, batch: list[HeldClaim], outcomes: list[str]) -> None:
        """The worker's result write (queue_async.record_results) of `batch`, each with its
        outcome, against the model."""
        chosen = [h for h in batch if h in self.held]
        results = [self._result(h, outcome) for h, outcome in zip(batch, outcomes, strict=True)]

        applied = self.paths[worker].record(results)

        expected_applied = 0
        for h, r in zip(batch, results, strict=True):
            d = self.deliveries[h.delivery]
            if not self._holds(worker, h):
                continue  # a late result: it changes nothing
            expected_applied += 1
            d.holder = d.locked_until = d.token = None
            if r.outcome == "released":
                d.status, d.attempt, d.next_attempt_at = "pending", d.attempt - 1, self.clock
                d.made -= 1
                self.lost.append(h)  # given back: a result of it from now on is stale
                continue
            d.recorded += 1
            self.destinations[d.destination].record(r.outcome, self.clock)
            if r.outcome == "delivered":
                d.status, d.last_error = "delivered", None
            elif r.outcome == "dead":
                d.status, d.last_error = "dead", r.error
            else:
                assert r.next_attempt_at is not None
                d.status, d.next_attempt_at, d.last_error = (
                    "pending", r.next_attempt_at, r.error)
        assert applied == expected_applied
        self.held = [h for h in self.held if h not in chosen]

    def _result(self, h: HeldClaim, outcome: str) -> Result:
        """The Result the worker makes (engine.worker.outcome) for an answer to `h` (ok,
        fail: 500, gone: 410) or for giving it back (release), with the claim's token;
        a failure is retried per the schedule (the next try jittered) or dead."""
        if outcome == "release":
            return released(h.claim, self.clock)
        if outcome == "gone" and h.attempt > len(self.schedule):
            # A 410 on the last attempt is not dead for the worker: it keeps the delivery
            # for its disabled destination, due after the schedule's last delay, and a
            # claim after that one has no attempt left (outcome.attempts_used_up). Not
            # modelled: a 500 instead.
            outcome = "fail"
        status = {"ok": 200, "fail": 500, "gone": 410}[outcome]
        return answer(h.claim, status, self.clock, self.schedule, rng=self.rng,
                      duration_ms=5)

    @precondition(lambda self: self._stale())
    @rule(data=st.data())
    def stale_result(self, data: st.DataObject) -> None:
        """A late result of a claim its worker lost or gave back, whose delivery the same
        worker has claimed again at the same attempt: only the token tells it from the
        current claim's, and the guard (record_results.sql) must refuse it. Whatever its
        outcome, nothing changes (database_matches_model compares every row)."""
        h = data.draw(st.sampled_from(self._stale()))
        outcome = data.draw(st.sampled_from(self.outcomes), label="stale outcome")
        applied = self.paths[h.worker].record([self._result(h, outcome)])
        assert applied == 0, (
            f"a stale {outcome} result (claim token {h.token}) applied to delivery"
            f" {h.delivery}, in flight under token {self.deliveries[h.delivery].token}")
        type(self).stale_recorded += 1

    @rule(seconds=st.sampled_from((1, 5, 30, 61, 300, 1000, 4000)), reap=st.booleans())
    def time_passes(self, seconds: int, reap: bool) -> None:
        """The clock moves on; the maintenance process may then reap expired leases."""
        self.clock += dt.timedelta(seconds=seconds)
        self._set_clock(self.clock)
        if reap:
            returned = reap_expired(self.conn, self.max_attempts)
            assert returned == self._return_claims(None, "lease expired")

    @rule(action=st.sampled_from(
              ("pause", "resume", "replay", "replay_dead", "release_claims", "liveness")),
          index=st.integers(0, 1000), worker=st.sampled_from(WORKERS))
    def operate(self, action: str, index: int, worker: str) -> None:
        """What operators and the supervisor do now and then. `index` picks a destination
        or a delivery. Resuming also re-enables a destination a 410 disabled."""
        ids = sorted(self.destinations)
        x = self.destinations[ids[index % len(ids)]]
        if action in ("pause", "resume"):
            x.paused = action == "pause"
            x.disabled = x.disabled and x.paused
            self.conn.execute("UPDATE destinations SET paused = %s, disabled = %s WHERE id = %s",
                              [x.paused, x.disabled, x.id])
        elif action == "replay" and self.deliveries:
            d = self.deliveries[sorted(self.deliveries)[index % len(self.deliveries)]]
            replayed = queue_sync.replay_delivery(self.conn, d.id)
            assert replayed == (d.status != "in_flight")
            if replayed:
                d.status, d.attempt, d.next_attempt_at = "pending", 0, self.clock
        elif action == "replay_dead":
            dead = [d for d in self.deliveries.values()
                    if d.destination == x.id and d.status == "dead"]
            assert queue_sync.replay_dead(self.conn, x.id, batch=2) == len(dead)
            for d in dead:
                d.status, d.attempt, d.next_attempt_at = "pending", 0, self.clock
        elif action == "release_claims":
            returned = queue.release_claims(self.conn, worker, self.max_attempts)
            assert returned == self._return_claims(worker, "worker exited")
        elif action == "liveness":
            self._check_liveness()

    # -- checks ---------------------------------------------------------------------

    def _check_liveness(self) -> None:
        """Once every schedule, pause and lease has run out and no destination is paused
        or disabled, claiming again and again delivers everything: each claim finds
        something while anything is left. Runs in a transaction that is rolled back, on
        one connection of a worker's (the clock setting, too, is undone with it): the
        reaper's statement, then the worker's claims and result writes
        (queue_async), with the worker's results."""
        later = self.clock + dt.timedelta(days=30)
        reap = ReturnClaimsParams(
            locked_by=None, only_expired=True, reason="lease expired",
            max_attempts=self.max_attempts, batch_limit=queue.RETURN_BATCH,
            advisory_lock_class=queue.BREAKER_LOCK_CLASS,
            tenant_advisory_lock_class=queue.TENANT_LOCK_CLASS)

        async def deliver_everything(conn: psycopg.AsyncConnection) -> None:
            async with conn.transaction(force_rollback=True):
                await conn.execute("SELECT set_config('testclock.now', %s, false)",
                                   [later.isoformat()])
                await conn.execute("UPDATE destinations SET paused = false, disabled = false")
                # maintenance.reaper.reap_expired, on this connection.
                while await _returned(conn, reap) >= queue.RETURN_BATCH:
                    pass
                while True:
                    cursor = await conn.execute("SELECT count(*) FROM deliveries")
                    row = await cursor.fetchone()
                    if not row or not row[0]:
                        return
                    claims = await queue_async.claim_batch(
                        conn, LIVENESS_WORKER, 4, MODEL_LEASE_MS, 1)
                    assert claims, f"{row[0]} deliveries left, but none can be claimed"
                    results = [answer(c, 200, later, self.schedule) for c in claims]
                    assert await queue_async.record_results(
                        conn, LIVENESS_WORKER, results, MODEL_BREAKER) == len(results)

        self.paths[LIVENESS_WORKER].on_claim_conn(deliver_everything)

    @invariant()
    def database_matches_model(self) -> None:
        self.checked = False
        hot = {
            r[0]: r[1:] for r in self.conn.execute(
                "SELECT id, status::text, attempt, next_attempt_at, locked_by, locked_until,"
                " claim_token, last_error FROM deliveries").fetchall()
        }
        finished = {
            r[0]: r[1:] for r in self.conn.execute(
                "SELECT id, status::text, attempt, last_error FROM finished_deliveries"
            ).fetchall()
        }
        assert not hot.keys() & finished.keys(), "a delivery is both queued and finished"
        model = {d.id: d.row() for d in self.deliveries.values()}
        assert {**hot, **finished} == model

        rows = dict(self.conn.execute(
            "SELECT delivery_id, count(*) FROM delivery_attempts GROUP BY delivery_id"
        ).fetchall())
        for d in self.deliveries.values():
            # One attempt row per attempt made; the one in flight is written with its result.
            assert d.recorded == d.made - (d.status == "in_flight")
            assert rows.get(d.id, 0) == d.recorded, f"attempt rows of delivery {d.id}"
            # Dead only once the last attempt is used; never more attempts than that.
            if d.status == "dead":
                assert d.attempt == self.max_attempts
            assert d.attempt <= self.max_attempts - (d.status == "pending")

        destinations = {
            r[0]: r[1:] for r in self.conn.execute(
                "SELECT id, paused, disabled, breaker::text, consecutive_failures,"
                " breaker_pause_ms, paused_until, breaker_opened_at FROM destinations"
            ).fetchall()
        }
        assert destinations == {x.id: x.row() for x in self.destinations.values()}
        self.checked = True

    def teardown(self) -> None:
        # The final liveness check, unless a step already failed (its error is the one
        # to report).
        if self.checked:
            self._check_liveness()


MACHINE_SETTINGS = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def run_machine(machine: type[QueueMachine], dsn: str, conn: psycopg.Connection) -> None:
    """Run `machine` on `conn` and the workers' paths, each connection on the frozen
    clock; the run must have recorded stale results (the token guard's case)."""
    stop_autovacuum(conn)
    for statement in INSTALL_CLOCK:
        queue_sync.execute(conn, statement)
    machine.conn = conn
    machine.paths = {}
    machine.stale_recorded = 0
    try:
        for worker in (*WORKERS, LIVENESS_WORKER):
            machine.paths[worker] = WorkerPath(dsn, worker, lease_ms=MODEL_LEASE_MS,
                                               breaker=MODEL_BREAKER, setup=[SET_CLOCK_PATH])
        run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)
    finally:
        for path in machine.paths.values():
            path.close()
    assert machine.stale_recorded > 0, "no stale result was ever recorded"


def test_queue_matches_its_model(dsn: str, conn: psycopg.Connection) -> None:
    run_machine(QueueMachine, dsn, conn)


class BreakerMachine(QueueMachine):
    """The same model, narrowed to the breaker: one destination, a long retry schedule,
    one backlog up front, and only the rules that drive a breaker (claims, results, time),
    so that runs reach half-open probes with other attempts still in flight."""

    outcomes = ("ok", "fail", "fail", "release")

    @initialize(schedule=st.lists(st.sampled_from((10, 60, 300)), min_size=4, max_size=6),
                seed=st.integers(0, 2**32),
                events=st.lists(st.tuples(st.none(), st.none()), min_size=4, max_size=12))
    def start(self, schedule: list[int], seed: int,  # type: ignore[override]
              events: list[tuple[set[int] | None, str | None]]) -> None:
        super().start([False], schedule, seed, events)

    def enqueue(self, events: list[tuple[set[int] | None, str | None]]) -> None:
        """Not a rule here."""

    def operate(self, action: str, index: int, worker: str) -> None:
        """Not a rule here."""


def test_breaker_matches_its_model(dsn: str, conn: psycopg.Connection) -> None:
    run_machine(BreakerMachine, dsn, conn)


# ---------------------------------------------------------------------------------------
# 3. The retry schedule
# ---------------------------------------------------------------------------------------

# Delays in whole milliseconds so that every schedule has an exact textual form.
delays_ms = st.integers(1, 10 * 86_400_000)
schedules = st.lists(delays_ms, min_size=1, max_size=12).map(
    lambda ms: tuple(m / 1000 for m in sorted(ms)))
# Within float rounding of base * (1 ± JITTER).
ROUNDING = 1e-9


@settings(max_examples=EXAMPLES)
@given(schedule=schedules, rng=st.randoms(use_true_random=False))
def test_each_delay_is_within_the_jitter_of_its_step(
    schedule: tuple[float, ...], rng: random.Random
) -> None:
    for attempt, base in enumerate(schedule, start=1):
        delay = retry.retry_delay(schedule, attempt, rng)
        assert delay is not None
        low, high = base * (1 - retry.JITTER), base * (1 + retry.JITTER)
        assert low * (1 - ROUNDING) <= delay <= high * (1 + ROUNDING)
        assert delay > 0


@settings(max_examples=EXAMPLES)
@given(schedule=schedules, rng=st.randoms(use_true_random=False))
def test_retries_run_out_in_dead_after_the_last_step(
    schedule: tuple[float, ...], rng: random.Random
) -> None:
    """Following the schedule from the first attempt: every failure but the last gets a
    later try, so attempt times strictly increase; the failure of attempt
    len(schedule) + 1 = max_attempts is final (dead)."""
    attempt, elapsed, times = 1, 0.0, [0.0]
    while (delay := retry.retry_delay(schedule, attempt, rng)) is not None:
        attempt += 1
        elapsed += delay
        times.append(elapsed)
    assert attempt == retry.max_attempts(schedule) == len(schedule) + 1
    assert all(a < b for a, b in itertools.pairwise(times))
    for later in range(attempt, attempt + 3):
        assert retry.retry_delay(schedule, later, rng) is None
    with pytest.raises(ValueError):
        retry.retry_delay(schedule, 0, rng)


@settings(max_examples=EXAMPLES)
@given(schedule=schedules, rng=st.randoms(use_true_random=False))
def test_delays_grow_where_the_steps_outgrow_the_jitter(
    schedule: tuple[float, ...], rng: random.Random
) -> None:
    """Jitter can reorder neighbouring delays: step a may come out as late as a * 1.2 and
    step b as early as b * 0.8. So the delays themselves are only guaranteed to grow where
    b * 0.8 >= a * 1.2, i.e. b >= 1.5 a, as in the default schedule; where the steps are
    closer, the order of the two delays is up to chance (both extremes are reachable)."""
    delays = [retry.retry_delay(schedule, i, rng) for i in range(1, len(schedule) + 1)]
    ratio = (1 + retry.JITTER) / (1 - retry.JITTER)
    for (a, b), (da, db) in zip(itertools.pairwise(schedule), itertools.pairwise(delays),
                                strict=True):
        assert da is not None and db is not None
        if b >= a * ratio * (1 + ROUNDING):
            assert da <= db


class ExtremeJitter(random.Random):
    """Draws the highest jitter, then the lowest, alternately."""

    def __init__(self) -> None:
        super().__init__()
        self.high = True

    def uniform(self, a: float, b: float) -> float:
        self.high = not self.high
        return b if not self.high else a


@settings(max_examples=EXAMPLES)
@given(a=delays_ms, growth=st.floats(1.0, 1.49))
def test_close_steps_can_come_out_in_either_order(a: int, growth: float) -> None:
    """The bound above is tight: with steps closer than 1.5x, jitter can invert them."""
    schedule = (a / 1000, a * growth / 1000)
    rng = ExtremeJitter()
    first, second = retry.retry_delay(schedule, 1, rng), retry.retry_delay(schedule, 2, rng)
    assert first is not None and second is not None and first > second


UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
spaces = st.text(alphabet=" \t", max_size=2)


@st.composite
def numbers(draw: st.DrawFn) -> str:
    whole = draw(st.integers(0, 10**6))
    fraction = draw(st.none() | st.text(alphabet="0123456789", min_size=1, max_size=3))
    return f"{whole}" if fraction is None else f"{whole}.{fraction}"


@st.composite
def durations(draw: st.DrawFn) -> tuple[str, float]:
    """A duration as text, in any accepted spelling, and its value in seconds."""
    number, unit = draw(numbers()), draw(st.sampled_from(sorted(UNITS)))
    text = draw(spaces) + number + draw(spaces) + unit + draw(spaces)
    return text, float(number) * UNITS[unit]


# What a careless hand or a lax parser might add to a duration.
EXTRAS = ("-", "+", "e3", "E3", ".", "..", ",", "x", "_", "1", " ", "s", "ms", "0x", "inf",
          "nan", "\n")


@st.composite
def near_durations(draw: st.DrawFn) -> str:
    """A duration with something slipped in at a token boundary: mostly not valid."""
    number, unit = draw(numbers()), draw(st.sampled_from(sorted(UNITS)))
    extra = [draw(st.sampled_from(EXTRAS)) if draw(st.booleans()) else "" for _ in range(4)]
    return (extra[0] + draw(spaces) + number + extra[1] + draw(spaces) + extra[2] + unit
            + extra[3] + draw(spaces))


@settings(max_examples=EXAMPLES)
@given(duration=durations())
def test_parse_duration_reads_every_spelling(duration: tuple[str, float]) -> None:
    text, seconds = duration
    assert retry.parse_duration(text) == seconds


def reference_duration(text: str) -> float | None:
    """An independent reading of the duration grammar: a decimal number without sign or
    exponent, then a unit; whitespace around either."""
    body = text.strip(" \t\n")
    for unit in sorted(UNITS, key=len, reverse=True):
        if body.endswith(unit):
            number = body[: -len(unit)].rstrip(" \t\n")
            whole, dot, fraction = number.partition(".")
            if whole.isdigit() and whole.isascii() and (
                    not dot or (fraction.isdigit() and fraction.isascii())):
                return float(number) * UNITS[unit]
            return None
    return None


@settings(max_examples=EXAMPLES)
@given(text=near_durations() | st.text(alphabet="0123456789.,-+e smhdx\t", max_size=10))
def test_parse_duration_accepts_exactly_the_grammar(text: str) -> None:
    expected = reference_duration(text)
    if expected is None:
        with pytest.raises(ValueError):
            retry.parse_duration(text)
    else:
        assert retry.parse_duration(text) == expected


@pytest.mark.parametrize("text", [
    "", " ", "s", "5", "-5s", "+5s", "5e3s", "5E3s", ".5s", "5.s", "5..0s", "5,5s", "0x5s",
    "5_000s", "inf s", "nan s", "5 s s", "5sm", "5 x", "5 sec", "5 msec", "1 5s", "5\n\ns5",
])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        retry.parse_duration(text)


def spell(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % int(UNITS[unit] * 1000) == 0:
            return f"{ms // int(UNITS[unit] * 1000)}{unit}"
    return f"{ms}ms"


@settings(max_examples=EXAMPLES)
@given(ms=st.lists(delays_ms, min_size=1, max_size=12).map(sorted),
       separator=st.sampled_from((",", ", ", " , ")))
def test_parse_schedule_round_trips(ms: list[int], separator: str) -> None:
    text = separator.join(spell(m) for m in ms)
    parsed = retry.parse_schedule(text)
    assert len(parsed) == len(ms)
    assert all(math.isclose(p, m / 1000, rel_tol=1e-12) for p, m in zip(parsed, ms, strict=True))


@settings(max_examples=EXAMPLES)
@given(ms=st.lists(st.integers(0, 10**6), min_size=2, max_size=8),
       data=st.data())
def test_parse_schedule_refuses_what_is_not_a_schedule(
    ms: list[int], data: st.DataObject
) -> None:
    """Decreasing or non-positive delays, and an empty schedule, are refused."""
    assume(0 in ms or ms != sorted(ms))
    with pytest.raises(ValueError):
        retry.parse_schedule(",".join(f"{m}ms" for m in ms))
    with pytest.raises(ValueError):
        retry.parse_schedule(data.draw(st.sampled_from(("", " ", ",", " , ,"))))


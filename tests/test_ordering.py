"""Strict ordering per (destination, ordering_key) under several real worker processes
that claim and record through the worker's own path (tests/kit/worker_path.py: the
queue_async functions DeliveryWorker and its recorder call, on connections opened as the
worker opens them, with results built as the worker builds them, carrying their claim's
token), fail at random and crash at random (their claims come back through
release_claims, like the supervisor does, or through the lease reaper, like a lost
host). The "destination" is shared memory the workers update while
they send: it sees every request start and end, so it can tell two requests of one key
at once (across workers, or inside one claim batch) and the order in which deliveries
arrived."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import random
import time
from collections import Counter
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized, SynchronizedArray

import psycopg
import pytest
from hypothesis import event, example, given, settings, target
from hypothesis import strategies as st

from engine.db import queue
from engine.db.queue import BreakerSettings, EventIn
from engine.maintenance.reaper import reap_expired
from tests.kit import queue_sync
from tests.kit.data import add_destination
from tests.kit.dbserver import truncate_all
from tests.kit.worker_path import WorkerPath, answer

pytestmark = pytest.mark.pg_versions

MAX_ATTEMPTS = 1_000  # failures retry until they succeed: nothing dies, no gaps
SCHEDULE = (0.0,) * (MAX_ATTEMPTS - 1)  # ...and at once
FAILED = "HTTP 500"  # a failed attempt's error (outcome.response_result)
NO_BREAKER = BreakerSettings(threshold=10**6)
KEYS = ["a", "b", "c", None]  # None: an event without key (ordered as key '')
LEASE_MS = 60_000  # a live worker's claims never expire during an example
CRASHES_PER_EXAMPLE = 4  # then the replacements run without injected crashes
# The exit code of an injected crash. Any other non-zero exit is a real failure of the
# worker (an exception: multiprocessing exits 1 after printing its traceback).
CRASH_EXIT = 75
EXAMPLES_PER_SETUP = 15  # each of the 6 (processes x how crashes are returned) setups
ctx = multiprocessing.get_context("fork")


class Destination:
    """Shared between processes: requests open per key, arrivals in order, and what the
    workers recorded."""

    def __init__(self, capacity: int) -> None:
        self.lock = ctx.Lock()
        self.open: SynchronizedArray[int] = ctx.Array("i", len(KEYS), lock=False)
        self.overlaps: Synchronized[int] = ctx.Value("i", 0, lock=False)
        self.batch_duplicates: Synchronized[int] = ctx.Value("i", 0, lock=False)
        self.arrived: SynchronizedArray[int] = ctx.Array("i", 2 * capacity, lock=False)
        self.count: Synchronized[int] = ctx.Value("i", 0, lock=False)
        self.recorded: Synchronized[int] = ctx.Value("i", 0, lock=False)
        self.all_recorded = ctx.Event()
        # Bumped whenever something may have become claimable (a result recorded, claims
        # returned, an event enqueued): a worker whose claim came back empty waits for it
        # in shared memory instead of asking the database again and again.
        self.changes: Synchronized[int] = ctx.Value("i", 0, lock=False)

    def begin(self, keys: list[int]) -> None:
        """A claim batch's requests, all in flight at once (as a worker's curl multi sends
        them): two of one key in one batch is an overlap of its own."""
        with self.lock:
            if len(set(keys)) < len(keys):
                self.batch_duplicates.value += 1
            for key in keys:
                if self.open[key]:
                    self.overlaps.value += 1
                self.open[key] += 1

    def end(self, key: int, seq: int, accepted: bool) -> None:
        with self.lock:
            self.open[key] -= 1
            if accepted:
                i = self.count.value
                self.arrived[2 * i], self.arrived[2 * i + 1] = key, seq
                self.count.value = i + 1

    def changed(self) -> None:
        with self.lock:
            self.changes.value += 1

    def wait_for_change(self, since: int) -> None:
        """Until `changed` was called after `since` was read (or briefly, at most)."""
        give_up = time.monotonic() + 0.05
        while self.changes.value == since and time.monotonic() < give_up:
            time.sleep(0.0005)

    def add_recorded(self, delivered: int, total: int) -> None:
        with self.lock:
            self.recorded.value += delivered
            self.changes.value += 1
            if self.recorded.value >= total:
                self.all_recorded.set()

    def arrivals(self) -> list[tuple[int, int]]:
        return [(self.arrived[2 * i], self.arrived[2 * i + 1]) for i in range(self.count.value)]


def worker(dsn: str, name: str, ordered_id: int, total: int, seed: int, fail_p: float,
           crash_p: float, dest: Destination) -> None:
    rng = random.Random(seed)
    path = WorkerPath(dsn, name, lease_ms=LEASE_MS, breaker=NO_BREAKER)
    try:
        while not dest.all_recorded.is_set():
            before = dest.changes.value
            limit = rng.randint(1, 6)
            # The reserve as a worker computes it: a share of the limit (first_attempt_share).
            claims = path.claim(limit, int(rng.choice((0.0, 0.25, 0.5)) * limit))
            if not claims:  # the rest is in flight elsewhere, or blocked behind it
                dest.wait_for_change(before)
                continue
            sent = [(claim, *map(int, claim.payload.split(","))) for claim in claims]
            ordered = [(key, seq) for claim, key, seq in sent if claim.destination_id == ordered_id]
            dest.begin([key for key, _ in ordered])
            time.sleep(rng.random() * 0.001)  # the requests take a while
            outcomes = [rng.random() >= fail_p for _ in sent]
            if rng.random() < crash_p:
                # Dies mid-batch: the destination may or may not have taken each request.
                for key, seq in ordered:
                    dest.end(key, seq, rng.random() < 0.5)
                os._exit(CRASH_EXIT)
            for (claim, key, seq), ok in zip(sent, outcomes, strict=True):
                if claim.destination_id == ordered_id:
                    dest.end(key, seq, ok)
            t = dt.datetime.now(dt.UTC)
            results = [answer(claim, 200 if ok else 500, t, SCHEDULE)
                       for (claim, _, _), ok in zip(sent, outcomes, strict=True)]
            # Nobody returns a live worker's claims (leases outlast the example).
            assert path.record(results) == len(results)
            dest.add_recorded(sum(outcomes), total)
    finally:
        path.close()


def check_order(arrivals: list[tuple[int, int]], expected: dict[int, list[int]]) -> None:
    """Per key: arrivals never go back, and once repeats (at least once: sent by a worker
    that died before recording) are folded, they are exactly the enqueue order."""
    per_key: dict[int, list[int]] = {k: [] for k in expected}
    for key, seq in arrivals:
        seen = per_key[key]
        assert not seen or seq >= seen[-1], f"key {key}: {seq} arrived after {seen[-1]}"
        if not seen or seq != seen[-1]:
            seen.append(seq)
    assert per_key == expected


def return_claims(conn: psycopg.Connection, name: str, reap: bool) -> int:
    if reap:  # a lost host: its leases run out and the reaper returns them
        conn.execute("UPDATE deliveries SET locked_until = now() WHERE locked_by = %s", [name])
        return reap_expired(conn, MAX_ATTEMPTS)
    return queue.release_claims(conn, name, MAX_ATTEMPTS)  # the supervisor, at once


def run_workers(dsn: str, conn: psycopg.Connection, events: list[EventIn], ordered: int,
                processes: int, fail_p: float, crash_p: float, reap: bool, seed: int,
                dest: Destination) -> Counter[str]:
    """Enqueue `events` (half before the workers start, the rest one at a time while they
    run), run the workers until everything is recorded; returns what happened."""
    happened: Counter[str] = Counter()
    half = len(events) // 2
    with conn.transaction():
        queue_sync.enqueue_events(conn, events[:half])
    running: dict[BaseProcess, str] = {}

    def start(n: int) -> None:
        may_crash = happened["crashes"] < CRASHES_PER_EXAMPLE
        proc = ctx.Process(target=worker, args=(
            dsn, f"w{n}", ordered, 2 * len(events), seed + n, fail_p,
            crash_p if may_crash else 0.0, dest))
        proc.start()
        running[proc] = f"w{n}"

    try:
        for n in range(processes):
            start(n)
        for event_in in events[half:]:
            with conn.transaction():
                queue_sync.enqueue_events(conn, [event_in])
            dest.changed()
        n = processes
        deadline = time.monotonic() + 120
        while running:
            left = deadline - time.monotonic()
            assert left > 0 and wait([p.sentinel for p in running], left), \
                "workers did not finish"
            for proc in [p for p in running if p.exitcode is not None]:
                name = running.pop(proc)
                if proc.exitcode == 0:
                    continue
                assert proc.exitcode == CRASH_EXIT, \
                    f"worker {name} failed (exit code {proc.exitcode}): see its traceback"
                happened["crashes"] += 1
                happened["returned"] += return_claims(conn, name, reap)
                dest.changed()
                start(n)
                n += 1
    finally:
        for proc, name in running.items():  # after a failure: the others would wait for ever
            proc.kill()
            proc.join(10)
            assert proc.exitcode is not None, f"worker {name} still running 10 s after kill"
    return happened


@pytest.mark.parametrize("reap", [False, True], ids=["released", "reaped"])
@pytest.mark.parametrize("processes", [2, 3, 4])
def test_never_two_in_flight_never_out_of_order(
    dsn: str, conn: psycopg.Connection, processes: int, reap: bool
) -> None:
    totals: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES_PER_SETUP, deadline=None)
    @given(
        keys=st.lists(st.integers(0, len(KEYS) - 1), min_size=10, max_size=60),
        fail_p=st.sampled_from([0.0, 0.2, 0.4]),
        crash_p=st.sampled_from([0.0, 0.05, 0.1]),
        seed=st.integers(0, 2**16),
    )
    # One example that certainly crashes while retries are pending (the run's last
    # assertion): every worker dies on its first batch until CRASHES_PER_EXAMPLE, and 80
    # deliveries at 40% failure all succeeding first time has odds of 0.6**80.
    @example(keys=list(range(len(KEYS))) * 10, fail_p=0.4, crash_p=1.0, seed=1)
    def run_example(keys: list[int], fail_p: float, crash_p: float, seed: int) -> None:
        if conn.execute("SELECT EXISTS (SELECT 1 FROM deliveries)").fetchone() == (True,):
            truncate_all(conn)  # left over by a failed example (hypothesis shrinking)
        # Fresh destinations instead of a TRUNCATE per example: the last one finished all.
        ordered = add_destination(conn, ordered=True)
        unordered = add_destination(conn)
        expected: dict[int, list[int]] = {k: [] for k in range(len(KEYS))}
        events = []
        for seq, key in enumerate(keys):
            expected[key].append(seq)
            events.append(EventIn("t", f"{key},{seq}", [ordered, unordered],
                                  ordering_key=KEYS[key]))
        dest = Destination(capacity=len(keys) * 4)
        happened = run_workers(dsn, conn, events, ordered, processes, fail_p, crash_p, reap,
                               seed, dest)
        assert dest.batch_duplicates.value == 0, "two deliveries of one key in one batch"
        assert dest.overlaps.value == 0, "two deliveries of one key in flight at once"
        check_order(dest.arrivals(), expected)
        assert conn.execute(
            "SELECT count(*) FROM finished_deliveries WHERE status = 'delivered'"
            " AND destination_id = ANY (%s)", [[ordered, unordered]]).fetchone() \
            == (2 * len(keys),)
        retried = conn.execute(
            "SELECT count(*) FROM delivery_attempts a JOIN finished_deliveries f"
            " ON f.id = a.delivery_id WHERE f.destination_id = ANY (%s) AND a.error = %s",
            [[ordered, unordered], FAILED]).fetchone()
        assert retried is not None
        happened["failed_attempts"] = int(retried[0])
        target(float(happened["crashes"]), label="crashes")
        event(f"crashes: {min(happened['crashes'], CRASHES_PER_EXAMPLE)}")
        event(f"failures: {'yes' if happened['failed_attempts'] else 'no'}")
        totals.update(happened)
        totals["examples"] += 1
        if happened["crashes"] and happened["failed_attempts"]:
            totals["crashed_with_failures"] += 1

    run_example()
    # The run must have exercised what it is named after, not only the easy paths.
    assert totals["examples"] >= EXAMPLES_PER_SETUP, totals
    assert totals["crashes"] > 0 and totals["returned"] > 0, totals
    assert totals["crashed_with_failures"] > 0, totals

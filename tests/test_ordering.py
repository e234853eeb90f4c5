"""Strict ordering per (destination, ordering_key) under several real worker processes
that claim and record through engine.queue, fail at random and crash at random (their
claims come back through release_claims, like the supervisor does, or through the lease
reaper, like a lost host). The "destination" is shared memory the workers update while
they send: it sees every request start and end, so it can tell two requests of one key
at once and the order in which deliveries arrived."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import random
import time
from multiprocessing.sharedctypes import Synchronized, SynchronizedArray
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import queue
from engine.queue import BreakerSettings, EventIn, Result
from tests.dbserver import truncate_all
from tests.test_queue import add_destination

MAX_ATTEMPTS = 1_000  # failures retry until they succeed: nothing dies, no gaps
NO_BREAKER = BreakerSettings(threshold=10**6)
KEYS = ["a", "b", "c", None]  # None: an event without key (ordered as key '')
LEASE_MS = 60_000
ctx = multiprocessing.get_context("fork")


class Destination:
    """Shared between processes: requests open per key, and arrivals in order."""

    def __init__(self, capacity: int) -> None:
        self.lock = ctx.Lock()
        self.open: SynchronizedArray[int] = ctx.Array("i", len(KEYS), lock=False)
        self.overlaps: Synchronized[int] = ctx.Value("i", 0, lock=False)
        self.arrived: SynchronizedArray[int] = ctx.Array("i", 2 * capacity, lock=False)
        self.count: Synchronized[int] = ctx.Value("i", 0, lock=False)
        self.all_enqueued = ctx.Event()

    def begin(self, key: int) -> None:
        with self.lock:
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

    def arrivals(self) -> list[tuple[int, int]]:
        return [(self.arrived[2 * i], self.arrived[2 * i + 1]) for i in range(self.count.value)]


def worker(dsn: str, name: str, ordered_id: int, seed: int, fail_p: float, crash_p: float,
           dest: Destination) -> None:
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            claims = queue.claim_batch(conn, name, rng.randint(1, 6), LEASE_MS,
                                       rng.randint(0, 2))
            if not claims:
                if dest.all_enqueued.is_set() and conn.execute(
                        "SELECT count(*) FROM deliveries").fetchone() == (0,):
                    return
                time.sleep(0.01)
                continue
            results = []
            for claim in claims:
                payload = [int(x) for x in claim.payload.split(",")]
                key, seq = payload
                ordered = claim.destination_id == ordered_id
                if ordered:
                    dest.begin(key)
                time.sleep(rng.random() * 0.003)
                ok = rng.random() >= fail_p
                if rng.random() < crash_p:
                    # Dies mid-request: the destination may or may not have taken it.
                    if ordered:
                        dest.end(key, seq, ok and rng.random() < 0.5)
                    os._exit(1)
                if ordered:
                    dest.end(key, seq, ok)
                t = dt.datetime.now(dt.UTC)
                results.append(Result(claim.id, claim.attempt, "delivered" if ok else "retry",
                                      t, 1, 200 if ok else 500, None if ok else "e", None,
                                      None if ok else t))
            queue.record_results(conn, name, results, NO_BREAKER)


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


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    keys=st.lists(st.integers(0, len(KEYS) - 1), min_size=10, max_size=60),
    processes=st.integers(2, 4),
    fail_p=st.sampled_from([0.0, 0.2, 0.4]),
    crash_p=st.sampled_from([0.0, 0.02, 0.05]),
    reap=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_never_two_in_flight_never_out_of_order(
    dsn: str, conn: psycopg.Connection, keys: list[int], processes: int, fail_p: float,
    crash_p: float, reap: bool, seed: int,
) -> None:
    truncate_all(conn)
    ordered = add_destination(conn, ordered=True)
    unordered = add_destination(conn)
    expected: dict[int, list[int]] = {k: [] for k in range(len(KEYS))}
    events = []
    for seq, key in enumerate(keys):
        expected[key].append(seq)
        events.append(EventIn("t", f"{key},{seq}", [ordered, unordered],
                              ordering_key=KEYS[key]))
    dest = Destination(capacity=len(keys) * 4)
    half = len(events) // 2
    with conn.transaction():
        queue.enqueue_events(conn, events[:half])
    crashes_left = 4
    started: dict[Any, str] = {}

    def start(n: int, may_crash: bool) -> None:
        name = f"w{n}"
        proc = ctx.Process(target=worker, args=(
            dsn, name, ordered, seed + n, fail_p, crash_p if may_crash else 0.0, dest))
        proc.start()
        started[proc] = name

    for n in range(processes):
        start(n, True)
    for event in events[half:]:  # the rest arrives while the workers run, one at a time
        with conn.transaction():
            queue.enqueue_events(conn, [event])
    dest.all_enqueued.set()
    n = processes
    deadline = time.monotonic() + 120
    while started:
        assert time.monotonic() < deadline, "workers did not finish"
        for proc, name in list(started.items()):
            if proc.exitcode is None:
                continue
            del started[proc]
            if proc.exitcode != 0:
                if reap:  # a lost host: its leases run out and the reaper returns them
                    conn.execute("UPDATE deliveries SET locked_until = now()"
                                 " WHERE locked_by = %s", [name])
                    queue.reap_expired(conn, MAX_ATTEMPTS)
                else:  # a dead process: the supervisor returns its claims at once
                    queue.release_claims(conn, name, MAX_ATTEMPTS)
                crashes_left -= 1
                start(n, crashes_left > 0)
                n += 1
        time.sleep(0.01)
    assert dest.overlaps.value == 0
    check_order(dest.arrivals(), expected)
    assert conn.execute("SELECT count(*) FROM finished_deliveries WHERE status = 'delivered'"
                        ).fetchone() == (2 * len(keys),)

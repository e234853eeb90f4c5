"""rate_limit end to end: `engine --procs 3` (three worker processes claiming at once)
against the fake destination, which timestamps every request. Both bounds of the limit
are checked on what arrived: over any 10 s window at most rate x 10 plus one burst of the
rate, and, while there is backlog, at least 90 % of it. A destination without a limit is
not held up meanwhile, and nothing held back counts as an attempt or against the
breaker."""

from __future__ import annotations

from bisect import bisect_left
from pathlib import Path

import psycopg

from tests.kit.data import add_destination, count, enqueue, finished
from tests.kit.enginerun import wait_until
from tests.kit.fakedest import FakeDestination
from tests.kit.workers import engine

RATE = 20.0
WINDOW_MS = 10_000
# 16 s of work at the limit: every full 10 s window lies inside the backlog.
LIMITED = 320
UNLIMITED = 300


def window_counts(times_ms: list[int]) -> list[int]:
    """Requests in every 10 s window that starts at a request (the densest windows)."""
    times_ms = sorted(times_ms)
    return [bisect_left(times_ms, start + WINDOW_MS) - i for i, start in enumerate(times_ms)]


def test_rate_limit_bounds_hold_across_worker_processes(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    with FakeDestination() as fake:
        limited = add_destination(conn, url=fake.url("fast/limited"), rate_limit=RATE)
        warm_up = add_destination(conn, url=fake.url("fast/warm-up"))
        with engine(dsn, tmp_path, config, "--procs", "3"):
            # A running engine gets the backlog: its start (imports, connections, three
            # processes at once) is not what the limit is about.
            enqueue(conn, ['{"warm": 1}'], [warm_up])
            wait_until(lambda: finished(conn, warm_up) == 1, 60, "the engine is up")
            enqueue(conn, [f'{{"n": {i}}}' for i in range(LIMITED)], [limited])
            wait_until(lambda: finished(conn, limited) == LIMITED, 90, "limited done")
        arrivals = sorted(fake.arrivals("limited").values())
        stats = fake.name_stats("limited")

    assert len(arrivals) == LIMITED and stats["requests"] == LIMITED, stats
    windows = window_counts(arrivals)
    # Upper bound: rate x 10 s, plus one burst of at most the rate.
    assert max(windows) <= RATE * 10 + RATE, max(windows)
    # Lower bound: every 10 s window that lies wholly within the backlog uses >= 90 %.
    first, last = arrivals[0], arrivals[-1]
    assert last - first > WINDOW_MS, (first, last)
    full = [n for start, n in zip(arrivals, windows, strict=True)
            if start + WINDOW_MS <= last]
    assert full and min(full) >= 0.9 * RATE * 10, (min(full), len(full))

    # Held back is not failed: one attempt per delivery, no error, breaker untouched.
    assert count(conn, "SELECT count(*) FROM delivery_attempts a JOIN finished_deliveries f"
                       " ON f.id = a.delivery_id WHERE f.destination_id = %s", limited
                 ) == LIMITED
    row = conn.execute("SELECT consecutive_failures, breaker::text, failing_since"
                       " FROM destinations WHERE id = %s", [limited]).fetchone()
    assert row == (0, "closed", None)


def test_a_limited_destination_does_not_hold_up_the_others(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    """No lock serialises other destinations: a backlog behind a limit of 5/s is still
    mostly waiting when an unlimited destination's whole backlog is delivered. (A burst of
    other work delays sends after their claim, so this test checks no rate bounds: see
    the report on send-latency jitter.)"""
    with FakeDestination() as fake:
        limited = add_destination(conn, url=fake.url("fast/slow-limited"), rate_limit=5)
        unlimited = add_destination(conn, url=fake.url("fast/unlimited"))
        enqueue(conn, [f'{{"n": {i}}}' for i in range(100)], [limited])
        enqueue(conn, [f'{{"n": {i}}}' for i in range(UNLIMITED)], [unlimited])
        with engine(dsn, tmp_path, config, "--procs", "3"):
            wait_until(lambda: finished(conn, unlimited) == UNLIMITED, 60, "unlimited done")
            assert finished(conn, limited) < 50
            wait_until(lambda: finished(conn, limited) >= 1, 30, "limited started")

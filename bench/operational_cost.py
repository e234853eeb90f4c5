"""What an operational event costs the state change that emits it (issue 18).

    python bench/operational_cost.py [--dsn URL] [--rounds 40]

On a fresh database (embedded PostgreSQL 18, fsync on, unless --dsn): a destination with
one due delivery whose result opens its breaker (threshold 1), recorded by
record_results.sql, which then enqueues `engine.destination.breaker_opened` for every
subscriber in the same statement. Each round claims and records inside a transaction that
is rolled back, so every round starts from the same state; rounds alternate between 0, 1
and 10 subscribers. Reported: the median execution time of the record (EXPLAIN ANALYZE of
the statement, so the client and the commit are left out) per subscriber count, and what
the event adds over none.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys

import psycopg
from psycopg import RawCursor

from engine import queries, queue
from engine.operational_events import EVENT_TYPES
from engine.queue import BreakerSettings, EventIn, Result

import benchdb

OPENS_AT_ONCE = BreakerSettings(threshold=1)
SUBSCRIBERS = (0, 1, 10)


def add_destination(conn: psycopg.Connection, event_types: list[str] | None = None) -> int:
    row = conn.execute(
        "INSERT INTO destinations (url, secret, event_types) VALUES (%s, %s, %s) RETURNING id",
        ("http://127.0.0.1:9/hook", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", event_types),
    ).fetchone()
    assert row is not None
    return int(row[0])


def one_round(conn: psycopg.Connection, subscribers: int) -> tuple[float, int]:
    """The record's execution ms and the operational events it enqueued."""
    with conn.transaction(force_rollback=True):
        for _ in range(subscribers):
            add_destination(conn, list(EVENT_TYPES))
        failing = add_destination(conn)
        queue.enqueue_events(conn, [EventIn("order.created", "{}", [failing])])
        (claim,) = queue.claim_batch(conn, "bench", 10, 60_000)
        now = dt.datetime.now(dt.UTC)
        result = Result(claim.id, claim.attempt, "retry", now, 5, 500, "HTTP 500", None,
                        now + dt.timedelta(hours=1), claim_token=claim.claim_token)
        params = queue.record_params("bench", [result], OPENS_AT_ONCE)
        cursor = RawCursor(conn)
        cursor.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + queries.RECORD_RESULTS, params)
        row = cursor.fetchone()
        assert row is not None
        plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
        events = conn.execute("SELECT count(*) FROM events WHERE type LIKE 'engine.%'"
                              ).fetchone()
        return float(plan[0]["Execution Time"]), int(events[0]) if events else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="PostgreSQL server (a database is created on it)")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    times: dict[int, list[float]] = {n: [] for n in SUBSCRIBERS}
    events: dict[int, set[int]] = {n: set() for n in SUBSCRIBERS}
    with (benchdb.server(args.dsn) as admin,
          benchdb.fresh_database(admin, "engine_bench_operational") as dsn,
          psycopg.connect(dsn, autocommit=True) as conn):
        for _ in range(args.rounds):
            for n in SUBSCRIBERS:
                ms, emitted = one_round(conn, n)
                times[n].append(ms)
                events[n].add(emitted)
    base = statistics.median(times[0])
    report = {
        str(n): {"median_ms": round(statistics.median(times[n]), 3),
                 "min_ms": round(min(times[n]), 3),
                 "adds_ms": round(statistics.median(times[n]) - base, 3),
                 "operational_events": sorted(events[n])}
        for n in SUBSCRIBERS}
    print(json.dumps({"rounds": args.rounds, "by_subscribers": report}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

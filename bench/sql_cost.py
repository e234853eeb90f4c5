"""PostgreSQL execution time of the hot statements, from EXPLAIN (ANALYZE, BUFFERS).

    python bench/sql_cost.py [--dsn URL] [--rounds 10] [--history 200000]

On a fresh database (embedded PostgreSQL 18, fsync on, unless --dsn) with two
destinations, --history finished deliveries as history and a 20,000 pending backlog, each
round runs under EXPLAIN ANALYZE, each statement in its own committed transaction:
- enqueue_events: 1000 events fanned out to both destinations (POST /v1/events/batch);
- claim_batch of 500, then record_results of those 500, all delivered.
Reported per statement: median and min execution time, and the time of each trigger
(foreign-key checks show up there), medians over the rounds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from collections import defaultdict
from typing import Any

import psycopg
from psycopg import RawCursor

from engine import queries, queue
from engine.database import run_statement
from engine.queue import EventIn, Result

import benchdb

BACKLOG = 20_000
BATCH_EVENTS = 1000
CLAIM = 500
PAYLOAD = json.dumps({"type": "order.created", "data": {"items": ["x" * 40] * 20, "n": 0}})


def explain(conn: psycopg.Connection, statement: bytes, params: tuple) -> dict[str, Any]:
    """Run `statement` under EXPLAIN ANALYZE in its own transaction; returns the plan's
    top-level JSON (Execution Time, Triggers); the statement's own result is not returned."""
    with conn.transaction():
        cursor = RawCursor(conn)
        cursor.execute(b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params)
        row = cursor.fetchone()
    assert row is not None
    return row[0][0]


def enqueue_round(conn: psycopg.Connection) -> dict[str, Any]:
    events = [EventIn("order.created", PAYLOAD) for _ in range(BATCH_EVENTS)]
    return explain(conn, queries.ENQUEUE_EVENTS, queue._enqueue_params(events))


def record_round(conn: psycopg.Connection, worker: str) -> tuple[dict, dict]:
    """claim_batch of CLAIM under EXPLAIN, then record_results of what it claimed."""
    with conn.transaction():
        capped = [r[0] for r in run_statement(
            conn, queries.LOCK_CAPPED_DESTINATIONS, queue.lock_capped_params()
        ).fetchall()]
        cursor = RawCursor(conn)
        cursor.execute(
            b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + queries.CLAIM_BATCH,
            queue.claim_params(worker, CLAIM, 60_000, 0, capped),
        )
        row = cursor.fetchone()
        assert row is not None
        claimed = row[0][0]
    rows = conn.execute(
        "SELECT id, attempt FROM deliveries WHERE locked_by = %s", (worker,)
    ).fetchall()
    assert len(rows) == CLAIM, len(rows)
    now = dt.datetime.now(dt.UTC)
    results = [Result(id_, attempt, "delivered", now, 3, 200) for id_, attempt in rows]
    recorded = explain(conn, queries.RECORD_RESULTS, queue.record_params(worker, results))
    return recorded, claimed


def summarize(plans: list[dict[str, Any]]) -> dict[str, Any]:
    times = [p["Execution Time"] for p in plans]
    triggers: dict[str, list[float]] = defaultdict(list)
    for plan in plans:
        for trigger in plan.get("Triggers", []):
            name = f"{trigger['Trigger Name']} on {trigger['Relation']}"
            triggers[name].append(trigger["Time"])
    return {
        "execution_ms_median": round(statistics.median(times), 2),
        "execution_ms_min": round(min(times), 2),
        "trigger_ms_median": {k: round(statistics.median(v), 2) for k, v in triggers.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--history", type=int, default=200_000)
    args = parser.parse_args()
    load_before = benchdb.machine()
    with benchdb.server(args.dsn) as admin, benchdb.fresh_database(
        admin, "engine_bench_sql_cost"
    ) as url, psycopg.connect(url, autocommit=True) as conn:
        destinations = benchdb.add_destinations(conn, 2)
        if args.history:
            benchdb.add_finished(conn, args.history, destinations)
        with conn.transaction():
            for _ in range(BACKLOG // BATCH_EVENTS // 2):
                queue.enqueue_events(
                    conn, [EventIn("order.created", PAYLOAD) for _ in range(BATCH_EVENTS)]
                )
        conn.execute("VACUUM (ANALYZE)")
        worker = queue.worker_id("sql-cost")
        enqueued, recorded, claimed = [], [], []
        for _ in range(args.rounds):
            enqueued.append(enqueue_round(conn))
            done, claim = record_round(conn, worker)
            recorded.append(done)
            claimed.append(claim)
        result = {
            "enqueue_events_1000x2": summarize(enqueued),
            "record_results_500": summarize(recorded),
            "claim_batch_500": summarize(claimed),
            "rounds": args.rounds,
            "history": args.history,
            "settings": benchdb.settings(conn),
            "machine_before": load_before,
            "machine_after": benchdb.machine(),
        }
    line = (
        f"| enqueue 1000x2 {result['enqueue_events_1000x2']['execution_ms_median']} ms"
        f" | record 500 {result['record_results_500']['execution_ms_median']} ms"
        f" | claim 500 {result['claim_batch_500']['execution_ms_median']} ms |"
    )
    benchdb.write_report("sql_cost", result, line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

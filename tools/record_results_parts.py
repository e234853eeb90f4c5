"""What each part of record_results.sql costs PostgreSQL: the statement as it is, and with
one of its CTEs cut at a time (the attempt row, the per-minute rollup, the finished row),
interleaved over claims of 500 deliveries, on a throwaway server.

    python -m tools.record_results_parts [--pg15] [--statements 400]

Prints the median time of a 500-result statement and per result for each variant.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time

import psycopg
from psycopg import RawCursor

from bench.harness import stack
from engine.db import queries, queue_async
from engine.domain import Result
from tests.kit import queue_sync

BATCH = 500


def cut(text: str, start: str, end: str) -> str:
    """`text` without the CTE that begins with `start`, up to the next one (`end`)."""
    return text[:text.index(start)] + text[text.index(end):]


def variants() -> dict[str, bytes]:
    full = queries.RECORD_RESULTS.sql.decode()
    return {name: text.encode() for name, text in {
        "as is": full,
        "without the attempt row": cut(full, "), history AS (", "), minutes AS ("),
        "without the minute rollup": cut(full, "), minutes AS (", "), outcomes AS ("),
        "without the finished row": cut(full, "), archived AS (", "), requeued AS ("),
    }.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg15", action="store_true", help="the machine's PostgreSQL 15")
    parser.add_argument("--statements", type=int, default=400)
    args = parser.parse_args()
    texts = variants()
    names = list(texts)
    with stack.server(None, stock_pg15_cluster=args.pg15) as admin, \
            stack.fresh_database(admin, "record_results_parts") as dsn, \
            psycopg.connect(dsn, autocommit=True,
                            options="-c plan_cache_mode=force_generic_plan") as conn:
        destination = stack.add_destination(conn, "http://127.0.0.1:9/")
        conn.execute(
            "WITH e AS (INSERT INTO events (type, payload, delivery_count, tenant_id)"
            " SELECT 't', repeat('p', 1000), 1, 1 FROM generate_series(1, %s)"
            " RETURNING id, created_at)"
            " INSERT INTO deliveries (event_id, destination_id, tenant_id, created_at)"
            " SELECT id, %s, 1, created_at FROM e",
            (BATCH * (args.statements + 10), destination))
        conn.execute("VACUUM ANALYZE")
        times: dict[str, list[float]] = {name: [] for name in names}
        for k in range(args.statements + 10):
            claims = queue_sync.claim_batch(conn, "w", BATCH, 60_000)
            now = dt.datetime.now(dt.UTC)
            params = queue_async.record_params("w", [
                Result(c.id, c.attempt, "delivered", now, 3, 200, claim_token=c.claim_token)
                for c in claims])
            name = names[k % len(names)]
            started = time.perf_counter()
            row = RawCursor(conn).execute(texts[name], params, prepare=True).fetchone()
            took = time.perf_counter() - started
            assert row is not None and row[0] == len(claims)
            if k >= 10:  # after the plans settled
                times[name].append(took * 1000)
    for name, ms in times.items():
        median = statistics.median(ms)
        print(f"{name}: {median:.2f} ms a statement, {median * 1000 / BATCH:.1f} µs a result")


if __name__ == "__main__":
    main()

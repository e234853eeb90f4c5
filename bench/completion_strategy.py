"""Where does a delivered row go? Measures the two designs on one server, fsync on.

    python bench/completion_strategy.py [--dsn URL] [--deliveries 50000] [--repeat 1]

(A) move at completion, the engine's design: record_results deletes the finished row from
    `deliveries` and inserts it into `finished_deliveries` in the statement that records
    the attempt (engine/sql/record_results.sql, unchanged).
(B) update in place: the completion only sets status = 'delivered' (the same statement
    otherwise: attempt history, the holder guard), and an archiver later moves delivered
    rows to `finished_deliveries` in batches. B runs on a database whose `deliveries`
    lacks the CHECK that keeps finished statuses out; tables and indexes are otherwise the
    same.

Each run gets a fresh database with --deliveries pending deliveries, VACUUM ANALYZE and a
CHECKPOINT (so both start with the same full-page-image debt), then one connection claims
batches of 100 with the engine's claim_batch and completes each batch as delivered in one
statement until the queue is empty. Autovacuum stays on, as in production; the WAL it
writes during a phase is counted in that phase. Reported per phase: rows/s, WAL bytes per
delivery (pg_current_wal_lsn difference), dead tuples left in `deliveries`, and the size of
`deliveries` and `finished_deliveries` (table + indexes) afterwards.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import RawCursor

from engine import queue
from engine.queue import Claim, Result

import benchdb

BATCH = 100
ARCHIVE_BATCH = 5_000
LEASE_MS = 60_000
DESTINATIONS = 10

# (B)'s completion: record_results.sql with the move replaced by an in-place update.
# Everything delivered, so the breaker part of record_results has nothing to write.
COMPLETE_IN_PLACE = b"""
WITH result AS (
    SELECT *
      FROM unnest($2::bigint[], $3::smallint[], $4::timestamptz[], $5::int[], $6::smallint[])
           AS r(id, attempt, started_at, duration_ms, status_code)
), done AS (
    UPDATE deliveries d
       SET status = 'delivered', locked_by = NULL, locked_until = NULL
      FROM result r
     WHERE d.id = r.id AND d.attempt = r.attempt
       AND d.status = 'in_flight' AND d.locked_by = $1
 RETURNING d.id
), history AS (
    INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code)
    SELECT r.id, r.attempt, r.started_at, r.duration_ms, r.status_code
      FROM result r JOIN done ON done.id = r.id
)
SELECT count(*) FROM done
"""

# (B)'s archiver: move one batch of delivered rows, oldest first.
ARCHIVE = b"""
WITH batch AS (
    SELECT id FROM deliveries WHERE status = 'delivered'
     ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM deliveries d USING batch WHERE d.id = batch.id RETURNING d.*
), archived AS (
    INSERT INTO finished_deliveries
           (id, event_id, destination_id, status, attempt, next_attempt_at,
            ordering_key, last_error, created_at)
    SELECT id, event_id, destination_id, status, attempt, next_attempt_at,
           ordering_key, last_error, created_at
      FROM moved
)
SELECT count(*) FROM moved
"""


def prepare(conn: psycopg.Connection, deliveries: int, in_place: bool) -> None:
    destinations = benchdb.add_destinations(conn, DESTINATIONS)
    if in_place:
        conn.execute("ALTER TABLE deliveries DROP CONSTRAINT deliveries_status_check")
    with conn.transaction():
        conn.execute(
            "WITH ev AS ("
            "  INSERT INTO events (type, payload, delivery_count)"
            "  SELECT 'order.created', '{\"order\": ' || g || ', \"note\": \"a payload\"}', 1"
            "    FROM generate_series(1, %s) g RETURNING id)"
            " INSERT INTO deliveries (event_id, destination_id)"
            " SELECT id, (%s::bigint[])[1 + id %% %s] FROM ev ORDER BY id",
            (deliveries, destinations, len(destinations)),
        )
    conn.execute("VACUUM (ANALYZE)")
    conn.execute("CHECKPOINT")


def wal_lsn(conn: psycopg.Connection) -> str:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def table_state(conn: psycopg.Connection) -> dict[str, int]:
    # Make this backend's counters visible, then read fresh ones.
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT s.n_live_tup, s.n_dead_tup, s.autovacuum_count,"
        "       pg_table_size('deliveries'), pg_indexes_size('deliveries'),"
        "       pg_table_size('finished_deliveries'), pg_indexes_size('finished_deliveries')"
        "  FROM pg_stat_user_tables s WHERE s.relname = 'deliveries'"
    ).fetchone()
    assert row is not None
    keys = ("live_tuples", "dead_tuples", "autovacuums", "deliveries_table_bytes",
            "deliveries_index_bytes", "finished_table_bytes", "finished_index_bytes")
    return dict(zip(keys, (int(v) for v in row), strict=True))


def measured(
    conn: psycopg.Connection, deliveries: int, step: Callable[[], int]
) -> dict[str, Any]:
    """Run `step` until it returns 0; WAL and time for the whole phase."""
    start_lsn = wal_lsn(conn)
    started = time.perf_counter()
    done = 0
    while (moved := step()) > 0:
        done += moved
    elapsed = time.perf_counter() - started
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (start_lsn,)
                       ).fetchone()
    assert row is not None
    assert done == deliveries, (done, deliveries)
    return {
        "seconds": round(elapsed, 2),
        "rows_per_s": round(done / elapsed),
        "wal_bytes_per_delivery": round(float(row[0]) / deliveries),
        "after": table_state(conn),
    }


def completion_loop(
    conn: psycopg.Connection, complete: Callable[[Sequence[Claim]], int]
) -> Callable[[], int]:
    worker = queue.worker_id("bench")

    def step() -> int:
        claims = queue.claim_batch(conn, worker, BATCH, LEASE_MS)
        if claims:
            assert complete(claims) == len(claims)
        return len(claims)

    return step


def run_move(dsn: str, deliveries: int) -> dict[str, Any]:
    """(A): the engine's record_results."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        prepare(conn, deliveries, in_place=False)
        worker = queue.worker_id("bench")

        def complete(claims: Sequence[Claim]) -> int:
            now = dt.datetime.now(dt.UTC)
            return queue.record_results(
                conn, worker, [Result(c.id, c.attempt, "delivered", now, 10, 200) for c in claims]
            )

        return {"complete": measured(conn, deliveries, completion_loop(conn, complete))}


def run_in_place(dsn: str, deliveries: int) -> dict[str, Any]:
    """(B): update in place, then archive in batches."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        prepare(conn, deliveries, in_place=True)
        worker = queue.worker_id("bench")

        def complete(claims: Sequence[Claim]) -> int:
            now = dt.datetime.now(dt.UTC)
            params = (worker, [c.id for c in claims], [c.attempt for c in claims],
                      [now] * len(claims), [10] * len(claims), [200] * len(claims))
            with conn.transaction():
                row = RawCursor(conn).execute(COMPLETE_IN_PLACE, params).fetchone()
            return int(row[0]) if row else 0

        def archive() -> int:
            with conn.transaction():
                row = RawCursor(conn).execute(ARCHIVE, (ARCHIVE_BATCH,)).fetchone()
            return int(row[0]) if row else 0

        completed = measured(conn, deliveries, completion_loop(conn, complete))
        archived = measured(conn, deliveries, archive)
        return {"complete": completed, "archive": archived}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="server to use (default: embedded PostgreSQL 18)")
    parser.add_argument("--deliveries", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, alternating")
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    with benchdb.server(args.dsn) as admin:
        with psycopg.connect(admin) as conn:
            postgres = benchdb.settings(conn)
        for n in range(args.repeat):
            for label, strategy in (("A_move_at_completion", run_move),
                                    ("B_update_then_archive", run_in_place)):
                with benchdb.fresh_database(admin, "engine_bench_completion") as dsn:
                    result = strategy(dsn, args.deliveries)
                    runs.append({"run": n + 1, "strategy": label, **result})
    report = {
        "bench": "completion_strategy",
        "deliveries": args.deliveries,
        "claim_batch": BATCH,
        "archive_batch": ARCHIVE_BATCH,
        "embedded": args.dsn is None,
        "postgres": postgres,
        "machine": benchdb.machine(),
        "runs": runs,
    }
    lines = ["| run | strategy | phase | rows/s | WAL B/delivery | dead tuples |"
             " deliveries size | finished size |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        for phase in ("complete", "archive"):
            if phase not in r:
                continue
            p = r[phase]
            after = p["after"]
            lines.append(
                f"| {r['run']} | {r['strategy']} | {phase} | {p['rows_per_s']:,} |"
                f" {p['wal_bytes_per_delivery']:,} | {after['dead_tuples']:,} |"
                f" {(after['deliveries_table_bytes'] + after['deliveries_index_bytes']) >> 10:,}"
                f" KiB | {(after['finished_table_bytes'] + after['finished_index_bytes']) >> 10:,}"
                " KiB |"
            )
    benchdb.write_report("completion_strategy", report, "\n".join(lines))


if __name__ == "__main__":
    main()

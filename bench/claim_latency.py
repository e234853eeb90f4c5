"""Claim latency: p50/p99 of claim_batch(limit=50), each claim its own committed transaction,
with a million finished deliveries in the database.

    python bench/claim_latency.py [--dsn URL] [--claims 10000] [--refill complete|upfront]

Without --dsn it starts an embedded PostgreSQL 18 with fsync and synchronous_commit on in a
temporary folder. Two ways to keep every claim fed with 50 due deliveries:

- `complete` (default, a worker's steady state): a backlog of --backlog pending deliveries;
  after each claim the batch is recorded (90 % delivered, 10 % retried at once on their
  first attempt, so both branches of the claim have work) and as many new deliveries are
  enqueued as were delivered. The finished history grows by ~45 per claim. record_results
  and enqueue times are reported too.
- `upfront` (a backlog after an outage): claims * 50 pending deliveries inserted before the
  first claim, then only claims; the claimed rows stay in flight.

Every tenth claim is followed by an empty durable transaction (one that only takes a
transaction id, so its commit flushes WAL), timed the same way: `empty_commit_ms` is the
floor that the round trip, the fsync and the machine's load put under any claim.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from typing import Any

import psycopg

from engine import queue
from engine.queue import BreakerSettings, EventIn, Result

import benchdb

BATCH = 50
LEASE_MS = 60_000
FIRST_ATTEMPT_RESERVE = 12  # the default share, 0.25 of 50
DESTINATIONS = 10
# The simulated failures must not open breakers: that would take destinations out of the
# claim and measure something else.
NO_BREAKER = BreakerSettings(threshold=1_000_000_000)


def add_pending(conn: psycopg.Connection, count: int, destinations: list[int]) -> None:
    with conn.transaction():
        conn.execute(
            "WITH ev AS ("
            "  INSERT INTO events (type, payload, delivery_count)"
            "  SELECT 'order.created', '{\"order\": ' || g || '}', 1"
            "    FROM generate_series(1, %s) g RETURNING id)"
            " INSERT INTO deliveries (event_id, destination_id)"
            " SELECT id, (%s::bigint[])[1 + id %% %s] FROM ev ORDER BY id",
            (count, destinations, len(destinations)),
        )
    conn.execute("VACUUM (ANALYZE) events, deliveries")


def durable_commit(conn: psycopg.Connection) -> float:
    """The floor under every claim on this machine right now: a transaction that only
    takes a transaction id, so its commit writes and flushes WAL, timed the same way."""
    t = time.perf_counter()
    with conn.transaction():
        conn.execute("SELECT pg_current_xact_id()")
    return time.perf_counter() - t


def run(dsn: str, claims: int, refill: str, backlog: int, finished: int) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        destinations = benchdb.add_destinations(conn, DESTINATIONS)
        t0 = time.perf_counter()
        benchdb.add_finished(conn, finished, destinations)
        add_pending(conn, claims * BATCH if refill == "upfront" else backlog, destinations)
        fill_s = time.perf_counter() - t0

        claim_s: list[float] = []
        commit_s: list[float] = []
        record_s: list[float] = []
        enqueue_s: list[float] = []
        short = 0
        worker = queue.worker_id("bench")
        started = time.perf_counter()
        for n in range(claims):
            t = time.perf_counter()
            batch = queue.claim_batch(conn, worker, BATCH, LEASE_MS, FIRST_ATTEMPT_RESERVE)
            claim_s.append(time.perf_counter() - t)
            short += len(batch) < BATCH
            if n % 10 == 0:
                commit_s.append(durable_commit(conn))
            if refill == "upfront":
                continue
            now = dt.datetime.now(dt.UTC)
            results = [
                Result(c.id, c.attempt, "retry", now, 10, 500, "HTTP 500", None, now)
                if c.attempt == 1 and (c.id + n) % 10 == 0
                else Result(c.id, c.attempt, "delivered", now, 10, 200)
                for c in batch
            ]
            t = time.perf_counter()
            queue.record_results(conn, worker, results, NO_BREAKER)
            record_s.append(time.perf_counter() - t)
            delivered = sum(r.outcome == "delivered" for r in results)
            events = [
                EventIn("order.created", '{"order": 1}', [destinations[i % DESTINATIONS]])
                for i in range(delivered)
            ]
            t = time.perf_counter()
            with conn.transaction():
                queue.enqueue_events(conn, events)
            enqueue_s.append(time.perf_counter() - t)
        loop_s = time.perf_counter() - started
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM deliveries WHERE status = 'pending'),"
            "       (SELECT count(*) FROM finished_deliveries)"
        ).fetchone()
        assert counts is not None
        result: dict[str, Any] = {
            "bench": "claim_latency",
            "refill": refill,
            "claims": claims,
            "batch": BATCH,
            "short_claims": short,
            "finished_rows_at_start": finished,
            "finished_rows_at_end": counts[1],
            "pending_at_start": claims * BATCH if refill == "upfront" else backlog,
            "pending_at_end": counts[0],
            "claim_ms": benchdb.summary_ms(claim_s),
            "empty_commit_ms": benchdb.summary_ms(commit_s),
            "fill_s": round(fill_s, 1),
            "loop_s": round(loop_s, 1),
            "postgres": benchdb.settings(conn),
            "machine": benchdb.machine(),
        }
        if record_s:
            result["record_results_ms"] = benchdb.summary_ms(record_s)
            result["enqueue_ms"] = benchdb.summary_ms(enqueue_s)
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="server to use (default: embedded PostgreSQL 18)")
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--refill", choices=("complete", "upfront"), default="complete")
    parser.add_argument("--backlog", type=int, default=1_000,
                        help="pending deliveries kept in the queue with --refill complete")
    parser.add_argument("--finished", type=int, default=1_000_000)
    args = parser.parse_args()
    with benchdb.server(args.dsn) as admin, \
            benchdb.fresh_database(admin, "engine_bench_claim") as dsn:
        result = run(dsn, args.claims, args.refill, args.backlog, args.finished)
    result["embedded"] = args.dsn is None
    claim = result["claim_ms"]
    markdown = (
        f"| claim_batch({BATCH}) | refill={args.refill} | {args.finished:,} finished |"
        f" {args.claims:,} claims | p50 {claim['p50']} ms | p99 {claim['p99']} ms |"
        f" max {claim['max']} ms | empty commit p50 {result['empty_commit_ms']['p50']} ms |"
        f" PostgreSQL {result['postgres']['server_version']},"
        f" fsync={result['postgres']['fsync']} |"
    )
    benchdb.write_report("claim_latency", result, markdown)


if __name__ == "__main__":
    main()

"""What the console's per-minute rollup (delivery_minutes, schema/011) costs record_results.

    python bench/rollup_cost.py [--dsn URL] [--rounds 30] [--destinations 10]

On a fresh database (embedded PostgreSQL 18, fsync on, unless --dsn), rounds alternate
between record_results.sql as shipped and the same statement without its `minutes` CTE, on
batches of 500 claimed deliveries spread over --destinations destinations (80 % delivered,
10 % retried after a 503, 10 % dead after a timeout; durations 5-500 ms). Reported: the
median and min execution time of each (EXPLAIN ANALYZE), and their difference per batch.

Then two sessions record batches for the same two destinations at once, as two workers
would, each writing its own rollup row (writer = its backend pid, as shipped) and then
both writing one shared row (writer = 0, the alternative): the median wall time of a
record_results round trip in each case shows what the shared row's lock costs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import threading
import time
from typing import Any

import psycopg
from psycopg import RawCursor

from engine import queries, queue
from engine.database import engine_conninfo, run_statement
from engine.queue import BreakerSettings, EventIn, Result

import benchdb

BATCH = 500
_START, _END = b"), minutes AS (", b"), outcomes AS ("
WITHOUT_ROLLUP = (queries.RECORD_RESULTS[:queries.RECORD_RESULTS.index(_START)]
                  + queries.RECORD_RESULTS[queries.RECORD_RESULTS.index(_END):])
SHARED_ROW = queries.RECORD_RESULTS.replace(b"pg_backend_pid()", b"0")
# Breakers that never open: a paused destination's deliveries could not be claimed.
NEVER_OPEN = BreakerSettings(threshold=10**6)


def results_for(claims: list[queue.Claim], rng: random.Random) -> list[Result]:
    now = dt.datetime.now(dt.UTC)
    results = []
    for c in claims:
        roll = rng.random()
        if roll < 0.8:
            results.append(Result(c.id, c.attempt, "delivered", now, rng.randint(5, 500), 200,
                                   claim_token=c.claim_token))
        elif roll < 0.9:
            results.append(Result(c.id, c.attempt, "retry", now, rng.randint(5, 500), 503,
                                   "HTTP 503", "busy", now + dt.timedelta(hours=1),
                                   claim_token=c.claim_token))
        else:
            results.append(Result(c.id, c.attempt, "dead", now, 10_000, None, "timed out",
                                  claim_token=c.claim_token))
    return results


def claim(conn: psycopg.Connection, worker: str, count: int) -> list[queue.Claim]:
    """`count` claims (a claim may take fewer of a destination at a time than asked)."""
    claims: list[queue.Claim] = []
    while len(claims) < count:
        more = queue.claim_batch(conn, worker, count - len(claims), 60_000)
        if not more:
            raise SystemExit(f"the backlog ran out at {len(claims)} of {count} claims")
        claims += more
    return claims


def execution_ms(conn: psycopg.Connection, statement: bytes, params: tuple) -> float:
    with conn.transaction():
        cursor = RawCursor(conn)
        cursor.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
        row = cursor.fetchone()
    assert row is not None
    return float(row[0][0]["Execution Time"])


def enqueue(conn: psycopg.Connection, destinations: list[int], count: int) -> None:
    with conn.transaction():
        for start in range(0, count, 1000):
            queue.enqueue_events(conn, [
                EventIn("order.created", '{"n": 1}', [destinations[n % len(destinations)]])
                for n in range(start, min(count, start + 1000))])


def single_session(url: str, rounds: int, destinations: int) -> dict[str, Any]:
    rng = random.Random(17)
    with psycopg.connect(engine_conninfo(url), autocommit=True) as conn:  # jit off
        ids = benchdb.add_destinations(conn, destinations)
        enqueue(conn, ids, rounds * 2 * BATCH)
        conn.execute("VACUUM (ANALYZE)")
        worker = queue.worker_id("rollup-cost")
        times: dict[str, list[float]] = {"with_rollup": [], "without_rollup": []}
        for n in range(rounds * 2):
            variant = "with_rollup" if n % 2 else "without_rollup"
            statement = queries.RECORD_RESULTS if n % 2 else WITHOUT_ROLLUP
            claims = claim(conn, worker, BATCH)
            params = queue.record_params(worker, results_for(claims, rng), NEVER_OPEN)
            times[variant].append(execution_ms(conn, statement, params))
    summary: dict[str, Any] = {
        k: {"median_ms": round(statistics.median(v), 3), "min_ms": round(min(v), 3)}
        for k, v in times.items()}
    summary["difference_median_ms"] = round(
        summary["with_rollup"]["median_ms"] - summary["without_rollup"]["median_ms"], 3)
    return summary


def two_writers(url: str, rounds: int) -> dict[str, Any]:
    """Median record_results wall time of two concurrent sessions for the same two
    destinations: own rows (as shipped) vs one shared row per (minute, destination)."""
    with psycopg.connect(url, autocommit=True) as conn:
        ids = benchdb.add_destinations(conn, 2)
        enqueue(conn, ids, 2 * 2 * rounds * 100)
    out: dict[str, Any] = {}
    for name, statement in (("own_rows", queries.RECORD_RESULTS), ("shared_row", SHARED_ROW)):
        times: list[float] = []
        lock = threading.Lock()

        def writer(tag: str, statement: bytes = statement, times: list[float] = times,
                   lock: threading.Lock = lock) -> None:
            rng = random.Random(tag)
            with psycopg.connect(engine_conninfo(url), autocommit=True) as conn:
                worker = queue.worker_id(tag)
                for _ in range(rounds):
                    claims = claim(conn, worker, 100)
                    params = queue.record_params(worker, results_for(claims, rng), NEVER_OPEN)
                    started = time.perf_counter()
                    with conn.transaction():
                        run_statement(conn, statement, params).fetchall()
                    with lock:
                        times.append((time.perf_counter() - started) * 1000)

        threads = [threading.Thread(target=writer, args=(f"{name}-{i}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out[name] = {"median_ms": round(statistics.median(times), 3),
                     "p90_ms": round(sorted(times)[int(0.9 * len(times))], 3)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--destinations", type=int, default=10)
    args = parser.parse_args()
    load_before = benchdb.machine()
    with benchdb.server(args.dsn) as admin:
        with benchdb.fresh_database(admin, "engine_bench_rollup_cost") as url:
            single = single_session(url, args.rounds, args.destinations)
        with benchdb.fresh_database(admin, "engine_bench_rollup_writers") as url:
            concurrent = two_writers(url, args.rounds)
            with psycopg.connect(url) as conn:
                server = benchdb.settings(conn)
    result = {"record_results_500": single, "two_writers_100": concurrent,
              "rounds": args.rounds, "destinations": args.destinations, "settings": server,
              "machine_before": load_before, "machine_after": benchdb.machine()}
    medians = [single["without_rollup"]["median_ms"], single["with_rollup"]["median_ms"],
               concurrent["own_rows"]["median_ms"], concurrent["shared_row"]["median_ms"]]
    line = ("| record 500 without rollup {} ms | with {} ms | two writers own rows {} ms"
            " | shared row {} ms |".format(*medians))
    benchdb.write_report("rollup_cost", result, line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

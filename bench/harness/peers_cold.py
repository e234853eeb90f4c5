"""The cold mode of the peers scenario (`python bench/peers.py drain-fast --mode cold`): the
engine started fresh for each run and its backlog posted through the public API.

    python bench/peers.py drain-fast --mode cold [--count 20000|100000] [--stock-pg15]
                          [--cap 2000] [--procs 2] [--repeat 3] [--post-batch 1000]
                          [--post-connections 4] [--analyze]

One engine run (`run_engine`), on a fresh migrated database:

1. the fake destination is started and warmed up as in warm mode (Node's own warm-up, not
   the engine's: a customer's endpoint has long been running);
2. `engine --procs N --max-in-flight M` starts (new processes) and answers /healthz;
3. the destination is made through the API (`POST /v1/destinations`, with
   `max_in_flight` = --cap), then paused (`PATCH /v1/destinations/{id} {"paused": true}`):
   the workers are running but **held**, they claim nothing of a paused destination;
4. the backlog is posted through `POST /v1/events/batch`, --post-batch events a request
   over --post-connections keep-alive connections (each event the same ~1 KB payload as
   warm mode's, one delivery each);
5. the destination is resumed (`PATCH ... {"paused": false}`), and the drain is timed from
   the first request the destination sees to the last, as in warm mode.

So everything the engine does to get going counts: no engine warm-up deliveries, no HTTP
connection to the destination open yet, the claim statements' first runs on the full
backlog, the ramp to full speed. The backlog is complete before the first delivery (held,
not drained while posting), so the rate is the drain's, not the posting's; posting's own
rate is reported beside it (`posting`).

The pgqueuer run (peers.run_peer in cold mode) is its counterpart: a fresh database,
`pgqueuer install`, the backlog enqueued through pgqueuer's own API (`Queries.enqueue`) in
--post-batch jobs a transaction, then the worker processes started, timed the same way.
Neither side gets a VACUUM ANALYZE from the bench (a new user's server has only
autovacuum); `analyzed` says whether autovacuum had analyzed the queue table before the
drain began. --analyze runs VACUUM ANALYZE on both sides once the backlog is in.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import psycopg

from bench.harness import drain, drain_watch, stack
from engine.testing.fakedest import FakeDestination

BENCH_DB = "engine_bench_cold"
# The batch endpoint takes at most this many events a request (engine/ingress/schemas.py).
MAX_BATCH = 1000
# The bar for the cold drain of 100,000 (issue 43: median of >= 3 pairs).
TARGET_RATIO = 3.5
ANALYZED_SQL = (
    "SELECT relname, last_autoanalyze IS NOT NULL OR last_analyze IS NOT NULL"
    "  FROM pg_stat_user_tables WHERE relname = ANY(%s) ORDER BY relname")


class Api:
    """A keep-alive HTTP/1.1 connection to the engine's ingress (one per thread)."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                               timeout=120)

    def call(self, method: str, path: str, body: bytes, expect: int) -> Any:
        self.conn.request(method, path, body, {"content-type": "application/json"})
        response = self.conn.getresponse()
        text = response.read()
        if response.status != expect:
            raise stack.BenchError(
                f"{method} {path}: HTTP {response.status}, expected {expect}: {text[:300]!r}")
        return json.loads(text) if text else None

    def close(self) -> None:
        self.conn.close()


def api_call(base_url: str, method: str, path: str, body: Any, expect: int) -> Any:
    api = Api(base_url)
    try:
        return api.call(method, path, json.dumps(body).encode(), expect)
    finally:
        api.close()


def batch_body(n: int) -> bytes:
    """A `POST /v1/events/batch` body of `n` events carrying drain.PAYLOAD as their payload,
    byte for byte (the API keeps a payload's text as received)."""
    event = f'{{"type": "order.created", "payload": {drain.PAYLOAD}}}'
    return f'{{"events": [{", ".join([event] * n)}]}}'.encode()


def batch_sizes(count: int, batch: int) -> list[int]:
    """`count` split into requests of `batch` events, the last one shorter."""
    return [min(batch, count - start) for start in range(0, count, batch)]


def post_backlog(base_url: str, count: int, batch: int, connections: int) -> dict[str, Any]:
    """Post `count` events in batches over `connections` keep-alive connections; what it
    took (not part of the drain's time)."""
    sizes = batch_sizes(count, batch)
    bodies = {n: batch_body(n) for n in set(sizes)}
    queue = list(sizes)
    accepted = [0] * connections

    def sender(k: int) -> None:
        api = Api(base_url)
        try:
            while queue:
                try:
                    n = queue.pop()
                except IndexError:
                    return
                answer = api.call("POST", "/v1/events/batch", bodies[n], 202)
                accepted[k] += sum(int(e["deliveries"]) for e in answer["data"])
        finally:
            api.close()

    started = time.monotonic()
    with ThreadPoolExecutor(connections) as pool:
        for future in [pool.submit(sender, k) for k in range(connections)]:
            future.result()
    seconds = time.monotonic() - started
    return {"events": count, "deliveries_accepted": sum(accepted), "requests": len(sizes),
            "batch": batch, "connections": connections, "seconds": round(seconds, 2),
            "events_per_s": round(count / seconds) if seconds > 0 else None}


def analyzed(conn: psycopg.Connection, tables: list[str]) -> dict[str, bool]:
    """Whether each table had been analyzed (by autovacuum or by hand) by now."""
    return {name: bool(done) for name, done in conn.execute(ANALYZED_SQL, (tables,)).fetchall()}


def run_engine(name: str, admin_dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """One cold engine run (the module's docstring says how)."""
    count, path = drain.SCENARIOS[name]
    count = args.count or count
    with (
        stack.fresh_database(admin_dsn, BENCH_DB) as dsn,
        FakeDestination(extra_args=["--keep", "0"]) as dest,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        drain.warm_destination(dest.url("fast/warm-up"), args.warm,
                               args.procs * args.max_in_flight)
        server = stack.server_report(conn)
        pg_pid = stack.postmaster_pid(conn)
        load_before = os.getloadavg()
        started = time.monotonic()
        with stack.Engine(dsn, args.procs, ["--max-in-flight", str(args.max_in_flight)]
                          ) as engine:
            ready_s = time.monotonic() - started
            base = engine.base_url
            created = api_call(base, "POST", "/v1/destinations",
                               {"url": dest.url(path), "max_in_flight": args.cap}, 201)
            where = f"/v1/destinations/{created['id']}"
            api_call(base, "PATCH", where, {"paused": True}, 200)
            posting = post_backlog(base, count, args.post_batch, args.post_connections)
            if posting["deliveries_accepted"] != count:
                raise stack.BenchError(f"posted {count} events, the engine accepted"
                                       f" {posting['deliveries_accepted']} deliveries")
            if args.analyze:
                conn.execute("VACUUM ANALYZE deliveries, events, destinations")
            stats_before = analyzed(conn, ["deliveries", "events"])
            api_call(base, "PATCH", where, {"paused": False}, 200)
            assert engine.proc is not None
            watched = drain_watch.watch_drain(dest, count, {
                "engine": [engine.pid], "postgres": [pg_pid], "destination": [dest.pid]},
                [engine.proc])
            command = engine.command
        # Stopped (SIGTERM: what was in flight is finished and recorded).
        pending = conn.execute("SELECT count(*) FROM deliveries").fetchone()
        finished = conn.execute(
            "SELECT count(*) FROM finished_deliveries WHERE status = 'delivered'").fetchone()
    return {
        "scenario": name,
        "mode": "cold",
        "deliveries": count,
        "cap": args.cap,
        "recorded_delivered": finished[0] if finished else None,
        "left_in_queue": pending[0] if pending else None,
        **drain_watch.drain_report(watched),
        "engine_ready_s": round(ready_s, 2),
        "posting": posting,
        "analyzed_before_drain": stats_before,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "postgres": server,
        "destination_warm_up_requests": args.warm,
        "engine_command": command,
    }


async def enqueue_batches(dsn: str, count: int, batch: int) -> dict[str, Any]:
    """The pgqueuer backlog through its own API: `batch` jobs an enqueue call, each call
    its own transaction (as each of the engine's batch requests is)."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    from bench.harness.peer_pgqueuer import ENTRYPOINT

    payload = drain.PAYLOAD.encode()
    connection = await asyncpg.connect(dsn)
    started = time.monotonic()
    try:
        queries = Queries(AsyncpgDriver(connection))
        for n in batch_sizes(count, batch):
            await queries.enqueue([ENTRYPOINT] * n, [payload] * n, [0] * n)
    finally:
        await connection.close()
    seconds = time.monotonic() - started
    return {"jobs": count, "batch": batch, "seconds": round(seconds, 2),
            "jobs_per_s": round(count / seconds) if seconds > 0 else None}


def prepare_peer_backlog(conn: psycopg.Connection, dsn: str, count: int,
                         args: argparse.Namespace) -> dict[str, Any]:
    """The pgqueuer side's backlog in cold mode; what it took, and whether the queue table
    was analyzed before its workers start."""
    posting = asyncio.run(enqueue_batches(dsn, count, args.post_batch))
    if args.analyze:
        conn.execute("VACUUM ANALYZE")
    return {"posting": posting, "analyzed_before_drain": analyzed(conn, ["pgqueuer"])}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of cold mode (peers.py takes them in either mode)."""
    parser.add_argument("--post-batch", type=int, default=MAX_BATCH,
                        help="cold: events per POST /v1/events/batch (and jobs per pgqueuer"
                             f" enqueue), at most {MAX_BATCH}")
    parser.add_argument("--post-connections", type=int, default=4,
                        help="cold: connections posting the engine's backlog")
    parser.add_argument("--analyze", action="store_true",
                        help="cold: VACUUM ANALYZE both sides once the backlog is in"
                             " (default: autovacuum only, as a new user's server)")

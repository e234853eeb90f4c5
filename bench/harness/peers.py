"""The engine against pgqueuer, the fastest peer the issue measured, in pairs of runs.

    python bench/peers.py [drain-fast|drain-slow|many-destinations|capped-slow|all]
                          [--mode warm|cold] [--count N]
                          [--repeat N] [--dsn URL | --stock-pg15] [--cap N] [--procs 2]
                          [--peer-in-flight 100] [--peer-batch-size 10] [--warm N]
                          [--engine-warm N]

--mode warm (the default) is what follows. --mode cold starts the engine fresh for each
run and posts its backlog through the public API (`POST /v1/events/batch`) while its
workers are held (the destination paused), pgqueuer's through its own API before its
workers start, both timed from the first request at the destination: peers_cold.py beside
this file says how. Cold mode runs drain-fast and drain-slow pairs only (`all`: both);
`--count 20000` or `--count 100000` sets the backlog.

--stock-pg15 runs everything on a throwaway cluster of the machine's PostgreSQL 15 with its
packaged defaults (JIT on): a new user's server. --cap N gives the engine's destination
max_in_flight N (pgqueuer has no such cap). `all` also runs the engine alone on
the drain's two destination mixes and reports many-destinations against the engine's
drain-fast median and capped-slow against its 5,000/s ceiling, and whether a cap was ever
exceeded. Every report records the server's build, jit and shared_buffers.

Each pair drains the same backlog twice on the same PostgreSQL server, one run right after
the other: first the engine (the drain scenario, unchanged: `engine --procs N` with
default settings), then pgqueuer (peer_pgqueuer.py beside this file: N worker processes
with asyncpg, uvloop and aiohttp, --peer-in-flight jobs each; the issue measured it at
100). Both POST the same ~1 KB of JSON to a fresh fake destination warmed up the same way,
and both are timed the same way: from the first to the last request the destination saw.
Reported per pair: both rates, CPU per delivery, and engine / pgqueuer. On this shared
2-core machine the speed drifts by up to 25% from one quarter of an hour to the next and
moves both runs of a pair alike, so the ratio says more than either rate. The issue's
targets as ratios: drain-fast 14,000 against pgqueuer's 4,686/s is 3.0x; drain-slow 8,000
against 1,651/s is 4.8x.

JSON on stdout and under bench/reports/. Needs `pip install -e '.[bench]'` (pgqueuer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench.harness import drain, drain_watch, peers_cold, stack
from bench.harness.report import REPORTS, save_json
from engine.config import Settings
from engine.testing.fakedest import FakeDestination

# The peer's packages come with the bench extra, not the test one: without them --help and
# the registry still work, and main() says how to install them before it starts anything.
try:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    from bench.harness.peer_pgqueuer import ENTRYPOINT
except ImportError as missing:
    PEER_MISSING: ImportError | None = missing
else:
    PEER_MISSING = None

PEER_WORKER = Path(__file__).with_name("peer_pgqueuer.py")
PEER_DB = "engine_bench_pgqueuer"
TARGET_RATIOS = {"drain-fast": 14_000 / 4_686, "drain-slow": 8_000 / 1_651}
# Cold mode: issue 43's bar for drain-fast on 100,000 deliveries (none for drain-slow).
COLD_TARGET_RATIOS = {"drain-fast": peers_cold.TARGET_RATIO}


def as_url(dsn: str) -> str:
    """asyncpg takes only URLs; psycopg's conninfo may be key=value."""
    params = conninfo_to_dict(dsn)
    user = quote(str(params.get("user", "")), safe="")
    password = params.get("password")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else f"{user}@" if user else ""
    host = str(params.get("host", "localhost"))
    query = f"?host={quote(host, safe='')}" if host.startswith("/") else ""
    netloc = "" if query else host + (f":{params['port']}" if "port" in params else "")
    return f"postgresql://{auth}{netloc}/{quote(str(params.get('dbname', '')), safe='')}{query}"


async def install(dsn: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(connection)).install()
    finally:
        await connection.close()


async def enqueue(dsn: str, count: int) -> None:
    """`count` jobs carrying the engine's payload, committed at once."""
    connection = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(connection))
        payload = drain.PAYLOAD.encode()
        async with connection.transaction():
            for start in range(0, count, stack.ENQUEUE_BATCH):
                n = min(stack.ENQUEUE_BATCH, count - start)
                await queries.enqueue([ENTRYPOINT] * n, [payload] * n, [0] * n)
    finally:
        await connection.close()


def wait_until_empty(conn: psycopg.Connection, timeout_s: float) -> None:
    """Until pgqueuer has recorded every job done (its completions are buffered)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and conn.execute(
        "SELECT count(*) FROM pgqueuer"
    ).fetchone() != (0,):
        time.sleep(0.05)


def run_peer(name: str, admin_dsn: str, args: argparse.Namespace) -> dict[str, object]:
    count, path = drain.SCENARIOS[name]
    count = args.count or count
    with (
        stack.fresh_database(admin_dsn, PEER_DB, migrated=False) as conninfo,
        FakeDestination(extra_args=["--keep", "0"]) as dest,
        psycopg.connect(conninfo, autocommit=True) as conn,
    ):
        dsn = as_url(conninfo)
        drain.warm_destination(
            dest.url("fast/warm-up"), args.warm, args.procs * args.peer_in_flight)
        asyncio.run(install(dsn))
        cold: dict[str, Any] = {}
        if args.mode == "cold":
            # Through pgqueuer's API in batches, no VACUUM ANALYZE (peers_cold.py).
            cold = peers_cold.prepare_peer_backlog(conn, dsn, count, args)
        else:
            # The backlog is due when the workers start: pgqueuer opens 200 connections,
            # not 1,024, and a warm-up as the engine's (the backlog due only after it)
            # would cost it more than it saves: ANALYZE then sees no job due, and its
            # dequeue plan for the backlog costs far more PostgreSQL CPU per job
            # (bench/results/2026-11-30-drain-ingress-sql-rounds.md).
            asyncio.run(enqueue(dsn, count))
            conn.execute("VACUUM ANALYZE")
        pg_pid = stack.postmaster_pid(conn)
        server = stack.server_report(conn)
        command = [
            sys.executable, str(PEER_WORKER), "--dsn", dsn,
            "--url", dest.url(path), "--in-flight", str(args.peer_in_flight),
            "--batch-size", str(args.peer_batch_size),
        ]
        workers = [subprocess.Popen(command) for _ in range(args.procs)]
        try:
            watched = drain_watch.watch_drain(dest, count, {
                "pgqueuer": [w.pid for w in workers], "postgres": [pg_pid],
                "destination": [dest.pid]}, workers)
            # Done at the destination; the completions may still be on their way.
            wait_until_empty(conn, 10)
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(30)
        left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
    return {
        "peer": "pgqueuer",
        "scenario": name,
        "mode": args.mode,
        "deliveries": count,
        **cold,
        "left_in_queue": left[0] if left else None,
        **drain_watch.drain_report(watched),
        "peer_command": " ".join(command[1:]).replace(dsn, "DSN"),
        "postgres": server,
    }


def pair_summary(name: str, engine: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    return {
        "scenario": name,
        "mode": peer["mode"],
        "deliveries": peer["deliveries"],
        "engine_per_s": engine["deliveries_per_s"],
        "pgqueuer_per_s": peer["deliveries_per_s"],
        "ratio": round(engine["deliveries_per_s"] / peer["deliveries_per_s"], 2),
        "engine_cpu_us": engine["cpu_us_per_delivery"],
        "pgqueuer_cpu_us": peer["cpu_us_per_delivery"],
        "duplicates": [engine["duplicates"], peer["duplicates"]],
        "left_in_queue": [engine["left_in_queue"], peer["left_in_queue"]],
    }


def median_cpu(runs: list[dict[str, float]]) -> dict[str, float]:
    """The median CPU per delivery (µs) of each part over the runs of one side."""
    return {part: round(statistics.median(run[part] for run in runs), 1) for part in runs[0]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/peers.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "scenario", nargs="?", default="all", choices=[*drain.SCENARIOS, *drain.MIXES, "all"],
        help="all: the pairs, then the engine alone on the drain's destination mixes")
    stack.add_server_arguments(parser)
    parser.add_argument("--cap", type=int,
                        help="max_in_flight of the engine's destination (default: none)")
    parser.add_argument("--procs", type=int, default=2, help="processes of each side")
    parser.add_argument("--count", type=int, help="deliveries (default: the scenario's)")
    parser.add_argument("--max-in-flight", type=int, default=Settings().max_in_flight,
                        help="the engine's")
    parser.add_argument("--peer-in-flight", type=int, default=100)
    parser.add_argument("--peer-batch-size", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1, help="pairs of each scenario")
    parser.add_argument("--warm", type=int, default=drain.WARM_REQUESTS)
    parser.add_argument(
        "--engine-warm", type=int,
        help="warm: the engine's warm-up deliveries, as in bench/drain.py")
    parser.add_argument(
        "--mode", choices=["warm", "cold"], default="warm",
        help="warm: the engine drains a backlog made with SQL, after a warm-up; cold: a"
             " fresh engine drains a backlog posted through its API (peers_cold.py)")
    peers_cold.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.mode == "cold" and args.scenario in drain.MIXES:
        parser.error("--mode cold runs drain-fast and drain-slow (or all: both)")
    if args.mode == "cold" and args.engine_warm is not None:
        parser.error("--engine-warm is warm mode's: a cold engine sends no warm-up")
    if not 1 <= args.post_batch <= peers_cold.MAX_BATCH:
        parser.error(f"--post-batch must be 1 to {peers_cold.MAX_BATCH}")
    if PEER_MISSING is not None:
        print(f"bench peers: {PEER_MISSING.name or PEER_MISSING} is missing; install the bench's"
              " packages: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    names = list(drain.SCENARIOS) if args.scenario == "all" else [args.scenario]
    if args.scenario in drain.MIXES:
        names = []
    mixed_names = list(drain.MIXES) if args.scenario == "all" else [
        name for name in [args.scenario] if name in drain.MIXES]
    if args.mode == "cold":
        mixed_names = []
    run_engine = peers_cold.run_engine if args.mode == "cold" else partial(
        drain.run_scenario, cap=args.cap)
    prefix = "peers-cold" if args.mode == "cold" else "peers"

    pairs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    mixed: dict[str, list[dict[str, Any]]] = {name: [] for name in mixed_names}
    with stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin_dsn:
        for _ in range(args.repeat):
            for name in mixed_names:
                # The destination mixes have no pgqueuer side: it has no per-destination cap.
                report = drain.run_scenario(name, admin_dsn, args, cap=args.cap)
                mixed[name].append(report)
                save_json(REPORTS, name, report)
            for name in names:
                engine = run_engine(name, admin_dsn, args)
                time.sleep(1)
                peer = run_peer(name, admin_dsn, args)
                pair = pair_summary(name, engine, peer)
                pairs[name].append(pair)
                save_json(REPORTS, f"{prefix}-{name}",
                          {"pair": pair, "engine": engine, "pgqueuer": peer})
                print(json.dumps(pair), flush=True)
    targets = COLD_TARGET_RATIOS if args.mode == "cold" else TARGET_RATIOS
    medians: dict[str, Any] = {
        name: {
            "mode": args.mode,
            "deliveries": runs[0]["deliveries"],
            "ratios": [p["ratio"] for p in runs],
            "median_ratio": statistics.median(p["ratio"] for p in runs),
            "target_ratio": round(targets[name], 2) if name in targets else None,
            "median_engine_per_s": statistics.median(p["engine_per_s"] for p in runs),
            "median_pgqueuer_per_s": statistics.median(p["pgqueuer_per_s"] for p in runs),
            "median_engine_cpu_us": median_cpu([p["engine_cpu_us"] for p in runs]),
            "median_pgqueuer_cpu_us": median_cpu([p["pgqueuer_cpu_us"] for p in runs]),
            "load_avg_end": os.getloadavg(),
        }
        for name, runs in pairs.items()
    }
    single = medians.get("drain-fast", {}).get("median_engine_per_s")
    for name, runs in mixed.items():
        rate = statistics.median(int(r["deliveries_per_s"]) for r in runs)
        # many-destinations against the single destination's rate (drain-fast, with --cap
        # as given); capped-slow against its ceiling.
        against = drain.CAPPED_SLOW_CEILING if name == "capped-slow" else single
        medians[name] = {
            "deliveries_per_s": [r["deliveries_per_s"] for r in runs],
            "median_engine_per_s": rate,
            "share_of": "ceiling 5,000/s" if name == "capped-slow" else "drain-fast median",
            "share": round(rate / against, 3) if against else None,
            "caps_reached": [r["caps_reached"] for r in runs],
            "cap_ever_exceeded": any(r["cap_ever_exceeded"] for r in runs),
            "duplicates": sum(int(r["duplicates"] or 0) for r in runs),
        }
    print(json.dumps(medians, indent=2), flush=True)
    return 0


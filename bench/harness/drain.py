"""Drain benchmarks: how fast `engine --procs N` empties a backlog of pending deliveries.

    python bench/drain.py [drain-fast|drain-slow|all|many-destinations|capped-slow|mixes]
    (or python -m bench drain-fast|drain-slow|many-destinations|capped-slow [options])
                          [--dsn URL | --stock-pg15] [--cap N] [--procs 2] [--count N]
                          [--max-in-flight 1024] [--repeat N] [--warm N] [--engine-warm N]
                          [--cap N [--vs-uncapped]] [--rate-limit R [--vs-unlimited]]

drain-fast: 20,000 deliveries to a destination that answers at once; drain-slow: 10,000 to
one that answers after 100 ms (--cap N: that destination has max_in_flight N, and
--vs-uncapped runs each repeat without it too, just before; --rate-limit R: rate_limit R,
and --vs-unlimited likewise runs each repeat without it: a cap's or a limit's cost when it
does not bind, as the ratio of each pair in the summary). Destination
mixes: many-destinations, 20,000 deliveries over 1,000 destinations answering at once,
about half of them capped at 10-50; capped-slow, 10,000 over 100 destinations capped at 5
answering after 100 ms (ceiling 5,000/s). (A backlog over 10,000 tenants:
bench/harness/tenants_scale.py, `bench/run.sh tenants-10k`.) Each report says whether the
fake destination ever saw more concurrent requests for a capped destination than its cap.

The backlog is in the queue when the engine starts, due 8 s later; meanwhile the engine
sends --engine-warm deliveries to the same host under another name, which opens the
connections a running engine has (--engine-warm 0: the backlog is due at once, and the run
includes opening them). Without --dsn, a durable PostgreSQL (fsync and synchronous_commit
on) is started in a temporary folder: the embedded PostgreSQL 18, or with --stock-pg15 the
machine's PostgreSQL 15 with its packaged defaults (JIT on). Reports record the server's
build, jit (the server's and the engine sessions') and shared_buffers. The destination is
engine/testing/fakedest.mjs (it does not check signatures here: that would measure Node's
HMAC, and the tests check them), warmed up with --warm requests before the engine starts. Reported:
deliveries/s from the first to the last request the destination saw, CPU seconds of the
engine, PostgreSQL and the destination process trees (and per delivery), the destination's
highest concurrency, duplicates, and the machine's load, since other work on the machine
skews every number. JSON on stdout and under bench/reports/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

from bench.harness import stack
from bench.harness.drain_watch import drain_report, drain_stats, summary, watch_drain
from bench.harness.report import REPORTS, save_json
from engine.config import Settings
from engine.domain import EventIn
from engine.testing.fakedest import FakeDestination
from engine.worker.http.client import CurlPool, HttpResult

SCENARIOS = {
    # name: (deliveries, fakedest path)
    "drain-fast": (20_000, "fast/drain"),
    "drain-slow": (10_000, "slow/100/drain"),
}
# Destination mixes (see mix_targets): name -> (deliveries, destinations).
MIXES = {
    # 1,000 destinations answering at once, about half of them capped at 10-50: with the
    # caps far from binding, the rate should stay near drain-fast's.
    "many-destinations": (20_000, 1_000),
    # 100 destinations capped at 5, each answering after 100 ms: the caps bind, and the
    # ceiling is 100 x 5 / 0.1 s = 5,000 deliveries/s.
    "capped-slow": (10_000, 100),
}
CAPPED_SLOW_CAP = 5
CAPPED_SLOW_CEILING = 5_000  # deliveries/s: 100 destinations x 5 slots / 100 ms
MIX_SEED = 12  # the same caps on every run

BENCH_DB = "engine_bench_drain"
# Requests sent to a fresh fake destination before the engine starts (see warm_destination;
# docs/decisions/0007-drain-bench-warms-connections.md).
WARM_REQUESTS = 20_000
# The name the engine's own warm-up deliveries go to (see --engine-warm).
ENGINE_WARM_NAME = "engine-warm-up"
BACKLOG_DELAY_S = 8.0  # engine start-up (imports, migrations, forks) and its warm-up
# About 1 KB of JSON, as in the peers' measurements.
PAYLOAD = json.dumps({"type": "order.created", "data": {"items": ["x" * 40] * 20, "n": 0}})


class Target(NamedTuple):
    """One destination of a run: its fake destination path (whose last part, under
    "drain", names it at the fake destination), its max_in_flight, its deliveries."""

    path: str
    cap: int | None
    count: int


def targets(name: str, count: int | None, cap: int | None) -> list[Target]:
    if name in SCENARIOS:
        default_count, path = SCENARIOS[name]
        return [Target(path, cap, count or default_count)]
    return mix_targets(name, count)


def mix_targets(name: str, count: int | None) -> list[Target]:
    total, destinations = MIXES[name]
    total = count or total
    rng = random.Random(MIX_SEED)
    found = []
    for k in range(destinations):
        share = total // destinations + (1 if k < total % destinations else 0)
        if name == "capped-slow":
            found.append(Target(f"slow/100/drain/{k}", CAPPED_SLOW_CAP, share))
        else:
            cap = rng.randint(10, 50) if rng.random() < 0.5 else None
            found.append(Target(f"fast/drain/{k}", cap, share))
    return [t for t in found if t.count > 0]


def cap_report(watched_names: dict[str, dict[str, Any]], run: list[Target]) -> dict[str, Any]:
    """Whether any capped destination ever had more requests open at once than its cap,
    as the fake destination counted them, and how many had as many as their cap: a cap
    that was reached was binding, so a run with it measures the cap's ceiling as well
    as its cost (drain-slow with --cap 2000 reaches it on 2 x 1,024 slots)."""
    capped = [t for t in run if t.cap is not None]
    over = {}
    reached = 0
    for target in capped:
        name = target.path[target.path.index("drain"):]
        seen = int(watched_names.get(name, {}).get("max_concurrent", 0))
        if seen > target.cap:
            over[name] = {"cap": target.cap, "max_concurrent": seen}
        if seen >= target.cap:
            reached += 1
    return {
        "capped_destinations": len(capped),
        "caps": sorted({t.cap for t in capped}),
        "caps_reached": reached,
        "cap_ever_exceeded": bool(over),
        "caps_exceeded": over,
    }


def warm_destination(url: str, count: int, connections: int) -> None:
    """POST `count` requests shaped like deliveries to a fresh fake destination, over as
    many connections as the engine will open. Node compiles its HTTP path, and its path
    for a new connection, only after thousands of uses: a cold one spends ~50% more CPU
    per answer during the first ~300 ms of a run, which is Node's warm-up, not the
    engine's work (a customer's endpoint has long been running)."""
    body = PAYLOAD.encode()

    async def send_all() -> None:
        pool = CurlPool(max_connects=connections)
        finished = asyncio.get_running_loop().create_future()
        started = answered = 0

        def send_next() -> None:
            nonlocal started
            started += 1
            headers = [f"webhook-id: warm_{started}", "content-type: application/json",
                       "Expect:"]
            pool.start(url, headers, body, 10_000, on_done)

        def on_done(result: HttpResult | None) -> None:
            nonlocal answered
            answered += 1
            if started < count:
                send_next()
            elif answered == count and not finished.done():
                finished.set_result(None)

        for _ in range(min(connections, count)):
            send_next()
        await finished
        await pool.close()

    if count > 0:
        asyncio.run(send_all())


def engine_warm_up_count(args: argparse.Namespace) -> int:
    return args.procs * args.max_in_flight if args.engine_warm is None else args.engine_warm


def enqueue_backlog(
    dsn: str, destination: int | dict[int, int], count: int = 0, delay_s: float = 0,
) -> None:
    """`count` deliveries to `destination` (or so many per destination id), interleaved,
    due in `delay_s`, committed at once, then the NOTIFY that ingress sends after each
    commit."""
    counts = destination if isinstance(destination, dict) else {destination: count}
    left = dict(counts)
    order = []
    while left:
        for dest_id in list(left):
            order.append(dest_id)
            left[dest_id] -= 1
            if not left[dest_id]:
                del left[dest_id]
    asyncio.run(_enqueue_backlog(dsn, order, list(counts), delay_s))


async def _enqueue_backlog(
    dsn: str, order: Sequence[int], destinations: list[int], delay_s: float,
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        async with conn.transaction():
            await stack.enqueue(conn, [
                EventIn("order.created", PAYLOAD, [dest_id]) for dest_id in order])
            if delay_s:
                # From now, not from the transaction's start: the enqueue before took
                # seconds. One time for every row (the subquery is evaluated once): with
                # clock_timestamp() per row, the UPDATE's own duration would make the
                # backlog fall due a little at a time, and a worker's first claim would
                # come back short (bench/results/2026-12-03-capped-slow-write-path.md).
                await conn.execute(
                    "UPDATE deliveries SET next_attempt_at = due.at"
                    "  FROM (SELECT clock_timestamp() + make_interval(secs => %s) AS at) due"
                    " WHERE destination_id = ANY(%s)", (delay_s, destinations))
        await conn.execute(stack.NOTIFY)


def wait_until_recorded(
    conn: psycopg.Connection, dest: FakeDestination, destination: int, count: int,
    engine: subprocess.Popen[bytes],
) -> None:
    """Until the engine's warm-up deliveries are answered and recorded, which must be
    before the backlog falls due."""
    deadline = time.monotonic() + BACKLOG_DELAY_S
    while time.monotonic() < deadline:
        if engine.poll() is not None:
            raise RuntimeError(f"the engine exited during its warm-up: {engine.returncode}")
        delivered = int(dest.name_stats(ENGINE_WARM_NAME).get("delivered_ids", 0))
        if delivered >= count and conn.execute(
            "SELECT count(*) FROM deliveries WHERE destination_id = %s", (destination,)
        ).fetchone() == (0,):
            if drain_stats(dest).get("requests"):
                break  # too late: the backlog is being sent already
            return
        time.sleep(0.05)
    raise RuntimeError(
        f"the engine's warm-up was not done before the backlog fell due ({BACKLOG_DELAY_S} s "
        "after the engine started)")


def run_scenario(
    name: str, admin_dsn: str, args: argparse.Namespace, rate_limit: float | None = None,
    cap: int | None = None,
) -> dict[str, object]:
    """One drain; `cap` is drain-fast's and drain-slow's max_in_flight (the mixes set
    their own)."""
    run = targets(name, args.count, cap)
    count = sum(t.count for t in run)
    path = run[0].path
    with (
        stack.fresh_database(admin_dsn, BENCH_DB) as dsn,
        FakeDestination(extra_args=["--keep", "0"]) as dest,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        warm_destination(dest.url("fast/warm-up"), args.warm, args.procs * args.max_in_flight)
        per_destination: dict[int, int] = {}
        for t in run:
            dest_id = stack.add_destination(conn, dest.url(t.path), max_in_flight=t.cap,
                                            rate_limit=rate_limit)
            per_destination[dest_id] = t.count
        engine_warm = engine_warm_up_count(args)
        # With a warm-up, the backlog falls due a few seconds after the engine starts, when
        # its warm-up deliveries are done; it is in the queue, analyzed, all the same.
        enqueue_backlog(dsn, per_destination, delay_s=BACKLOG_DELAY_S if engine_warm else 0)
        conn.execute("VACUUM ANALYZE deliveries, events, destinations")
        warm_up = stack.add_destination(
            conn, dest.url(path[:path.index("drain")] + ENGINE_WARM_NAME))
        settings = stack.server_report(conn)
        pg_pid = stack.postmaster_pid(conn)

        command = [
            sys.executable, "-m", "engine.cli", "--dsn", dsn, "--procs", str(args.procs),
            "--allow-private-targets", "--max-in-flight", str(args.max_in_flight),
            "--bind", "127.0.0.1:0",  # ingress idles here; any free port
        ]
        load_before = os.getloadavg()
        engine = subprocess.Popen(command, cwd=stack.ROOT, stderr=subprocess.DEVNULL)
        try:
            if engine_warm:
                enqueue_backlog(dsn, warm_up, engine_warm)
                wait_until_recorded(conn, dest, warm_up, engine_warm, engine)
            watched = watch_drain(dest, count, {
                "engine": [engine.pid], "postgres": [pg_pid], "destination": [dest.pid]}, [engine])
        finally:
            engine.send_signal(signal.SIGTERM)
            engine.wait(60)
        pending = conn.execute("SELECT count(*) FROM deliveries").fetchone()
        attempt_ms = conn.execute(
            "SELECT percentile_disc(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY a.duration_ms)"
            "  FROM delivery_attempts a JOIN finished_deliveries f ON f.id = a.delivery_id"
            " WHERE f.destination_id = ANY(%s)", (list(per_destination),)
        ).fetchone()
        finished = conn.execute(
            "SELECT count(*) FROM finished_deliveries"
            " WHERE status = 'delivered' AND destination_id = ANY(%s)", (list(per_destination),)
        ).fetchone()

    return {
        "scenario": name,
        "deliveries": count,
        "destinations": len(run),
        "rate_limit": rate_limit,
        **cap_report(watched.stats.get("names", {}), run),
        "recorded_delivered": finished[0] if finished else None,
        "left_in_queue": pending[0] if pending else None,
        **drain_report(watched),
        # Request times as the engine measured them (from the start of the request to
        # its answer).
        "attempt_ms_p50_p90_p99": attempt_ms[0] if attempt_ms else None,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "postgres": settings,
        "destination_warm_up_requests": args.warm,
        "engine_warm_up_deliveries": engine_warm,
        "engine_command": " ".join(command[1:]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/drain.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", default="all",
                        choices=[*SCENARIOS, *MIXES, "all", "mixes"],
                        help="all: drain-fast and drain-slow; mixes: many-destinations and"
                             " capped-slow")
    stack.add_server_arguments(parser)
    parser.add_argument("--cap", type=int,
                        help="max_in_flight of the destination of drain-fast and drain-slow"
                             " (default: none)")
    parser.add_argument("--vs-uncapped", action="store_true",
                        help="with --cap: each repeat also runs without the cap, just before")
    parser.add_argument("--rate-limit", type=float,
                        help="rate_limit of the scenario's destinations (default: none)")
    parser.add_argument("--vs-unlimited", action="store_true",
                        help="with --rate-limit: each repeat also runs without the limit,"
                             " just before")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--count", type=int, help="deliveries (default: the scenario's)")
    parser.add_argument("--max-in-flight", type=int, default=Settings().max_in_flight)
    parser.add_argument(
        "--repeat", type=int, default=1,
        help="runs of each scenario (alternating with 'all'), then each one's median: on a "
             "shared 2-core machine single runs vary by 10-20%%")
    parser.add_argument(
        "--warm", type=int, default=WARM_REQUESTS,
        help="requests that warm up the fake destination before each run (0: none)")
    parser.add_argument(
        "--engine-warm", type=int,
        help="deliveries the engine sends to the destination's host (under another name) "
             "before the backlog falls due, so that its connections are open: the drain of "
             "a running engine (default: --procs x --max-in-flight). 0: the backlog is due "
             "when the engine starts, and the run includes opening every connection")
    parser.add_argument(
        "--reports", type=Path, default=REPORTS, help="folder for the JSON reports")
    args = parser.parse_args(argv)
    if args.vs_unlimited and args.rate_limit is None:
        parser.error("--vs-unlimited needs --rate-limit")
    if args.vs_uncapped and args.cap is None:
        parser.error("--vs-uncapped needs --cap")
    if args.vs_uncapped and args.vs_unlimited:
        parser.error("--vs-uncapped and --vs-unlimited: one comparison per run")
    names = {"all": list(SCENARIOS), "mixes": list(MIXES)}.get(args.scenario, [args.scenario])
    # The variants of each repeat, in order: (label suffix, cap, rate_limit). The bare one
    # runs first, then the one with the setting, so a pair shares the machine's moment.
    if args.vs_uncapped:
        variants = [("", None, args.rate_limit), ("-capped", args.cap, args.rate_limit)]
    elif args.vs_unlimited:
        variants = [("", args.cap, None), ("-rate-limit", args.cap, args.rate_limit)]
    else:
        variants = [("", args.cap, args.rate_limit)]

    runs: dict[str, list[dict[str, Any]]] = {}
    with stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin_dsn:
        for _ in range(args.repeat):
            for name in names:
                for suffix, cap, rate_limit in variants:
                    label = name + suffix
                    report = run_scenario(name, admin_dsn, args, rate_limit, cap)
                    runs.setdefault(label, []).append(report)
                    save_json(args.reports, label, report)
                    print(json.dumps(report, indent=2), flush=True)
    if args.repeat > 1 or len(variants) > 1:
        totals: dict[str, Any] = {label: summary(reports) for label, reports in runs.items()}
        if len(variants) > 1:
            suffix = variants[1][0]
            key = "cap_pairs" if args.vs_uncapped else "rate_limit_pairs"
            totals[key] = {name: setting_pairs(runs[name], runs[name + suffix])
                           for name in names}
        print(json.dumps(totals), flush=True)
    return 0


def setting_pairs(
    without: list[dict[str, Any]], with_setting: list[dict[str, Any]]
) -> dict[str, Any]:
    """With the setting (a cap, a rate limit) over without, run by run: deliveries/s, and
    the engine's and PostgreSQL's CPU per delivery (a pair ran back to back, so the
    machine's load skews both alike), the median of the rate ratios, and how many capped
    destinations reached their cap in each run with the setting (a cap that is reached
    binds: its ratio is not only what counting the slots costs)."""
    def ratios(value: Callable[[dict[str, Any]], float]) -> list[float]:
        return [round(value(b) / value(a), 3) for a, b in zip(without, with_setting, strict=True)]
    rates = ratios(lambda r: r["deliveries_per_s"])
    return {
        "deliveries_per_s": rates,
        "median_deliveries_per_s": statistics.median(rates),
        "engine_cpu_per_delivery": ratios(lambda r: r["cpu_us_per_delivery"]["engine"]),
        "postgres_cpu_per_delivery": ratios(lambda r: r["cpu_us_per_delivery"]["postgres"]),
        "caps_reached": [r["caps_reached"] for r in with_setting],
    }


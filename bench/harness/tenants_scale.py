"""tenants-10k: does the drain slow down, or cost PostgreSQL more per delivery, when the
backlog is spread over 10,000 tenants instead of one?

    python -m bench tenants-10k [--tenants 10000] [--deliveries 100000] [--quick]
                                [--repeat K] [--procs 2] [--dsn URL | --stock-pg15]

Two phases per repeat, each on a fresh database with a fresh `engine --procs N`, the order
alternating from one repeat to the next: `spread`, --tenants tenants with 3 destinations
each and --deliveries due deliveries spread evenly over those destinations (each event to
one destination, of its destination's tenant); `one tenant`, the same number of
destinations (--tenants x 3) all of one tenant, and the same deliveries over them. Every
destination answers at once (the fake destination's /fast/drain, told apart by a query
string the fake ignores, so it counts one drain).

The tenants and destinations are written with SQL in bulk, since 30,000 API calls would
take minutes: with the API's own statements (engine/sql/tenants/tenant_create.sql,
engine/sql/api/api_destination_create.sql) and the values its handlers pass for a
tenant with a uid and a name and a destination with only a url (a fresh secret each, the
default timeout), so the rows are the ones the API writes. The backlog is written as
sql/fill_tenant_backlog.sql and is timed like the drains (bench/harness/drain.py): due
a few seconds after the fill, analyzed, the fake destination and the engine's connections
warmed up first. Reported per phase, from the destination's first delivery to its last:
deliveries/s, and the CPU per delivery of the engine's, PostgreSQL's (the postmaster and
every backend, from /proc as psutil reads it) and the destination's process trees, as the
drains report it; then spread / one tenant for the rate and PostgreSQL's and the engine's
CPU per delivery. The pass lines (medians over the repeats): the rate at >= 0.90 x one
tenant's, PostgreSQL's CPU per delivery at <= 1.10 x.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import stack
from bench.harness.drain import (
    BACKLOG_DELAY_S,
    ENGINE_WARM_NAME,
    WARM_REQUESTS,
    enqueue_backlog,
    wait_until_recorded,
    warm_destination,
)
from bench.harness.drain_watch import drain_report, watch_drain
from bench.harness.report import REPORTS, save_json
from bench.harness.tenants import create_destinations, create_tenants, fill_backlog, median, ratio
from engine.config import Settings
from engine.testing.fakedest import FakeDestination

BENCH_DB = "engine_bench_tenants"
TENANTS, QUICK_TENANTS = 10_000, 300
DELIVERIES, QUICK_DELIVERIES = 100_000, 5_000
QUICK_WARM = 2_000
PER_TENANT = 3
# The backlog falls due 4 s later than a drain's: the VACUUM ANALYZE after the fill (100,000
# deliveries and events, 30,000 destinations, 10,000 tenants) takes seconds on a loaded
# machine, and the engine's warm-up must be done before the backlog falls due
# (drain.wait_until_recorded).
DUE_DELAY_S = BACKLOG_DELAY_S + 4.0
RATE_FLOOR = 0.90
PG_CPU_CEILING = 1.10


def run_phase(admin_dsn: str, args: argparse.Namespace, spread: bool) -> dict[str, Any]:
    """The backlog over args.tenants tenants (`spread`) or one, drained."""
    destinations = args.tenants * PER_TENANT
    uids = ([f"bench-{i:05d}" for i in range(args.tenants)] if spread else ["bench-one"])
    with (
        stack.fresh_database(admin_dsn, BENCH_DB) as dsn,
        FakeDestination(extra_args=["--keep", "0"]) as dest,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        warm_destination(dest.url("fast/warm-up"), args.warm, args.procs * args.max_in_flight)
        started = time.monotonic()
        tenant_ids = create_tenants(conn, uids)
        owners = [tenant_ids[k // PER_TENANT if spread else 0] for k in range(destinations)]
        destination_ids = create_destinations(
            conn, [(owner, dest.url(f"fast/drain?d={k}")) for k, owner in enumerate(owners)])
        created_s = time.monotonic() - started
        fill_backlog(conn, destination_ids, owners, args.deliveries, DUE_DELAY_S)
        conn.execute("VACUUM ANALYZE deliveries, events, destinations, tenants")
        filled_s = time.monotonic() - started - created_s
        warm_up = stack.add_destination(conn, dest.url(f"fast/{ENGINE_WARM_NAME}"))
        settings = stack.server_report(conn)
        pg_pid = stack.postmaster_pid(conn)
        engine_warm = args.procs * args.max_in_flight
        engine = stack.Engine(dsn, args.procs, ["--max-in-flight", str(args.max_in_flight)])
        load_before = os.getloadavg()
        engine.start()
        assert engine.proc is not None
        try:
            enqueue_backlog(dsn, warm_up, engine_warm)
            wait_until_recorded(conn, dest, warm_up, engine_warm, engine.proc)
            watched = watch_drain(dest, args.deliveries, {
                "engine": [engine.pid], "postgres": [pg_pid], "destination": [dest.pid]},
                [engine.proc])
        finally:
            engine.signal_stop()
            engine.wait_stopped()
        left = conn.execute("SELECT count(*) FROM deliveries").fetchone()
        recorded = conn.execute(
            "SELECT count(*), count(DISTINCT tenant_id) FROM finished_deliveries"
            " WHERE status = 'delivered' AND destination_id <> %s", (warm_up,)).fetchone()
    assert recorded is not None
    return {
        "phase": "spread" if spread else "one tenant",
        "tenants": len(uids),
        "destinations": destinations,
        "deliveries": args.deliveries,
        "recorded_delivered": recorded[0],
        "tenants_delivered_to": recorded[1],
        "left_in_queue": left[0] if left else None,
        **drain_report(watched),
        "bulk_create_s": round(created_s, 2),
        "fill_and_analyze_s": round(filled_s, 2),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "postgres": settings,
        "engine_command": engine.command,
        "destination_warm_up_requests": args.warm,
        "engine_warm_up_deliveries": engine_warm,
    }


def pair(one: dict[str, Any], spread: dict[str, Any]) -> dict[str, Any]:
    """One repeat: spread over one tenant, for the rate and the CPU per delivery."""
    return {
        "one_tenant_per_s": one["deliveries_per_s"],
        "spread_per_s": spread["deliveries_per_s"],
        "rate_ratio": ratio(spread["deliveries_per_s"], one["deliveries_per_s"]),
        "one_tenant_pg_cpu_us": one["cpu_us_per_delivery"]["postgres"],
        "spread_pg_cpu_us": spread["cpu_us_per_delivery"]["postgres"],
        "pg_cpu_ratio": ratio(spread["cpu_us_per_delivery"]["postgres"],
                              one["cpu_us_per_delivery"]["postgres"]),
        "engine_cpu_ratio": ratio(spread["cpu_us_per_delivery"]["engine"],
                                  one["cpu_us_per_delivery"]["engine"]),
    }


def verdict(pairs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The medians over the repeats and the two pass lines."""
    medians = {key: median([p[key] for p in pairs]) for key in pairs[0]}
    rate, pg_cpu = medians["rate_ratio"], medians["pg_cpu_ratio"]
    rate_pass = rate is not None and rate >= RATE_FLOOR
    cpu_pass = pg_cpu is not None and pg_cpu <= PG_CPU_CEILING
    return {
        "repeats": len(pairs),
        "median": medians,
        "rate_pass": rate_pass,
        "pg_cpu_pass": cpu_pass,
        "lines": [
            f"drain spread / one tenant: {rate} (floor {RATE_FLOOR:.2f}):"
            f" {'PASS' if rate_pass else 'FAIL'}",
            f"PostgreSQL CPU per delivery spread / one tenant: {pg_cpu} (ceiling"
            f" {PG_CPU_CEILING:.2f}): {'PASS' if cpu_pass else 'FAIL'}",
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench tenants-10k",
                                     description=__doc__.split("\n\n")[0])
    stack.add_server_arguments(parser)
    parser.add_argument("--tenants", type=int,
                        help=f"tenants of the spread phase, {PER_TENANT} destinations each"
                             f" (default {TENANTS:,}; --quick: {QUICK_TENANTS:,})")
    parser.add_argument("--deliveries", type=int,
                        help=f"due deliveries per phase (default {DELIVERIES:,};"
                             f" --quick: {QUICK_DELIVERIES:,})")
    parser.add_argument("--quick", action="store_true", help="a small size: a smoke run")
    parser.add_argument("--repeat", type=int, default=1,
                        help="pairs of phases (spread, one tenant), then each one's median")
    parser.add_argument("--procs", type=int, default=2, help="engine delivery workers")
    parser.add_argument("--max-in-flight", type=int, default=Settings().max_in_flight,
                        help="the engine's requests in flight per worker")
    parser.add_argument("--warm", type=int,
                        help="requests that warm up the fake destination before each phase"
                             f" (default {WARM_REQUESTS:,}; --quick: {QUICK_WARM:,})")
    parser.add_argument("--reports", type=Path, default=REPORTS,
                        help="folder for the JSON report")
    args = parser.parse_args(argv)
    args.tenants = args.tenants or (QUICK_TENANTS if args.quick else TENANTS)
    args.deliveries = args.deliveries or (QUICK_DELIVERIES if args.quick else DELIVERIES)
    if args.warm is None:
        args.warm = QUICK_WARM if args.quick else WARM_REQUESTS
    if min(args.tenants, args.deliveries, args.repeat, args.procs) < 1:
        parser.error("--tenants, --deliveries, --repeat and --procs must be positive")

    phases: list[dict[str, Any]] = []
    pairs = []
    try:
        with stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin_dsn:
            for k in range(args.repeat):
                # Alternating which phase runs first, so drift over the run skews neither.
                order = (True, False) if k % 2 == 0 else (False, True)
                ran = {spread: run_phase(admin_dsn, args, spread) for spread in order}
                phases += [ran[spread] for spread in order]
                pairs.append(pair(ran[False], ran[True]))
                print(f"tenants-10k: repeat {k + 1}: {json.dumps(pairs[-1])}",
                      file=sys.stderr, flush=True)
    except (stack.BenchError, RuntimeError) as exc:
        print(f"tenants-10k: {exc}", file=sys.stderr)
        return 1
    report = {
        "scenario": "tenants-10k",
        "options": {"tenants": args.tenants, "deliveries": args.deliveries,
                    "quick": args.quick, "repeat": args.repeat, "procs": args.procs,
                    "max_in_flight": args.max_in_flight, "warm": args.warm,
                    "stock_pg15": args.stock_pg15, "external_dsn": bool(args.dsn)},
        "git_commit": stack.git_commit(),
        "machine": stack.machine(),
        "phases": phases,
        "pairs": pairs,
        **verdict(pairs),
    }
    path = save_json(args.reports, "tenants-10k", report)
    print(json.dumps(report, indent=2), flush=True)
    for line in report["lines"]:
        print(line, flush=True)
    print(f"report: {path}", flush=True)
    return 0

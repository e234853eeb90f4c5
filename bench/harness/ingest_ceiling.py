"""Ingest ceiling (issue 43 item 4): in one run, on one PostgreSQL server and database, how
many events/s the engine accepts against how many single-row INSERTs pgbench commits.

    python -m bench ingest-ceiling [--dsn URL | --stock-pg15] [--duration 20]
                                   [--clients 32] [--batch-connections 4] [--batch 1000]
                                   [--procs 2] [--ingress-procs N] [--hold]
                                   [--load-tool wrk|locust] [--reports DIR]

Phases, in this order, each --duration seconds:

1. **pgbench**: --clients clients (`-j 2 -M prepared`), each transaction one INSERT of a
   row like an event into `pgbench_events` (`LIKE events INCLUDING ALL`: the same columns,
   defaults, identity and indexes), with the same ~1 KB payload the load tool posts
   (`type`, `payload`, `delivery_count` 2; the rest defaults, as ingress leaves them).
   The table is dropped after, then CHECKPOINT, so its WAL is not the engine's to write.
2. **load tool alone**: the load tool against a server that does nothing
   (noop_server.mjs, Node) with --clients connections: a floor of what it can send here
   (the no-op server shares the cores and may be what stops it), and its CPU per request.
3. **single**: `engine --procs N` with two fake destinations (every event fans out to
   both), --clients connections each posting `POST /v1/events` back to back over
   loopback.
4. **batch**: --batch-connections connections posting `POST /v1/events/batch` of --batch
   events.

The load tool is wrk (`apt-get install -y wrk`; C, nearly free of CPU) when installed,
else locust; --load-tool chooses. The engine is warmed up first (WARM_UP_S of paced load).
By default the workers deliver while ingest is measured, as in production (they run at
the engine's default niceness, below ingress); after the single phase the bench waits
until they have delivered what it accepted (not timed, not in its CPU), so the batch phase
starts on an empty queue (the batch phase is the last: its backlog is left behind).
--hold pauses both destinations through the API instead: ingest alone, the deliveries
queued.

Reported per phase: events/s (accepted answers only; the engine's phases are checked
against the rows in `events`), the load tool's p50/p99, and CPU seconds of the engine
(its whole process tree, and its ingress processes alone), PostgreSQL (postmaster and
every backend, those that ended too), the fake destination and the load tool (or
pgbench's client), with the load tool's cores in use. The ratios: single / pgbench
(issue 43's bar: >= 0.8), batch events/s (bar: >= 60,000), and single / the load tool
alone (near 1 would mean the load tool, not the engine, set the ceiling). JSON on stdout
and under bench/reports/ingest-ceiling-<stamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import ingress, stack
from bench.harness.peers_cold import api_call
from bench.harness.report import REPORTS, save_json
from engine.testing.fakedest import FakeDestination

BENCH_DB = "engine_bench_ingest_ceiling"
PAYLOAD_BYTES = 1024
# The payload ingress_wrk.lua and locustfile.py post (with PAYLOAD_BYTES 1024), byte for
# byte: pgbench inserts the same text.
PAYLOAD = '{"order": 42, "note": "' + "x" * (PAYLOAD_BYTES - 30) + '"}'
PGBENCH_TABLE = "pgbench_events"
PGBENCH_SCRIPT = (f"INSERT INTO {PGBENCH_TABLE} (type, payload, delivery_count)"
                  f" VALUES ('order.created', '{PAYLOAD}', 2);\n")
WARM_UP_S = 5
# Bars from issue 43 ("Done when").
TARGET_SINGLE_VS_PGBENCH = 0.8
TARGET_BATCH_EVENTS_PER_S = 60_000


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (the load tool, pgbench)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_pgbench(dsn: str, clients: int, seconds: int) -> dict[str, Any]:
    """pgbench's single-row INSERT rate into a table like `events` (phase 1)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {PGBENCH_TABLE}")
        conn.execute(f"CREATE TABLE {PGBENCH_TABLE} (LIKE events INCLUDING ALL)")
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(PGBENCH_SCRIPT)
    try:
        result = subprocess.run(
            [ingress.pgbench_bin(), "-n", "-M", "prepared", "-c", str(clients),
             "-j", str(min(2, clients)), "-T", str(seconds), "-f", script.name, dsn],
            capture_output=True, text=True, check=True, timeout=seconds + 120,
        )
    finally:
        os.unlink(script.name)
    found = re.search(r"tps = ([0-9.]+)", result.stdout)
    if found is None:
        raise stack.BenchError(f"pgbench printed no tps: {result.stdout[-500:]}")
    latency = re.search(r"latency average = ([0-9.]+) ms", result.stdout)
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT count(*) FROM {PGBENCH_TABLE}").fetchone()
        conn.execute(f"DROP TABLE {PGBENCH_TABLE}")
        conn.execute("CHECKPOINT")
    return {
        "tool": "pgbench", "clients": clients, "seconds": seconds,
        "events_per_s": float(found.group(1)), "rows": rows[0] if rows else None,
        "latency_avg_ms": float(latency.group(1)) if latency else None,
        "script": f"INSERT INTO {PGBENCH_TABLE} (type, payload, delivery_count)"
                  f" VALUES ('order.created', '<{len(PAYLOAD)} bytes of JSON>', 2)",
    }


def load_tool(name: str | None) -> str:
    """wrk if installed (or asked for), else locust."""
    if name == "wrk" and shutil.which("wrk") is None:
        raise SystemExit("--load-tool wrk: wrk is not installed (apt-get install -y wrk)")
    if name is None:
        name = "wrk" if shutil.which("wrk") else "locust"
    if name == "locust" and shutil.which("locust") is None:
        raise SystemExit("neither wrk nor locust found: apt-get install -y wrk,"
                         " or pip install -e '.[bench]'")
    return name


def run_load(tool: str, base_url: str, *, mode: str, connections: int, seconds: int,
             batch: int = 1000, delay_ms: float = 0) -> dict[str, Any]:
    """One phase of load from wrk or locust, with the CPU the load tool used."""
    before = children_cpu()
    result: dict[str, Any] | None
    if tool == "wrk":
        result = ingress.run_wrk(base_url, mode=mode, connections=connections,
                                 seconds=seconds, batch=batch, delay_ms=delay_ms)
    else:
        user_rps = 1000 / delay_ms if delay_ms else 0
        result = ingress.run_locust(base_url, mode=mode, users=connections, seconds=seconds,
                                    batch=batch, user_rps=user_rps)
        result["tool"] = "locust"
    if result is None:
        raise stack.BenchError(f"{tool} did not run")
    cpu = children_cpu() - before
    result["load_tool_cpu_s"] = round(cpu, 3)
    result["load_tool_cores"] = round(cpu / seconds, 3)
    requests = result["requests_per_s"] * seconds
    result["load_tool_cpu_us_per_request"] = round(cpu / requests * 1e6, 1) if requests else None
    return result


def count_events(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM events").fetchone()
    return int(row[0]) if row else 0


def measured(parts: dict[str, int], ingress_pids: list[int], dsn: str,
             run: Callable[[], dict[str, Any]], *, drain: bool) -> dict[str, Any]:
    """Run an engine phase: its result with the CPU seconds each part used during it and the
    events it added to `events`; then, with `drain`, wait (untimed) until the workers have
    delivered what it accepted."""
    events_before = count_events(dsn)
    before = {name: ingress.tree_cpu_total(pid) for name, pid in parts.items()}
    ingress_before = ingress.own_cpu(ingress_pids)
    result = run()
    cpu = {name: round(ingress.tree_cpu_total(pid) - before[name], 3)
           for name, pid in parts.items()}
    cpu["engine_ingress"] = round(ingress.own_cpu(ingress_pids) - ingress_before, 3)
    cpu["load_tool"] = result["load_tool_cpu_s"]
    result["cpu_s"] = cpu
    result["events_in_table"] = count_events(dsn) - events_before
    # The load tool counts the answers it read within the phase; the table also has what
    # was in flight when it stopped (a batch's 1,000 events weigh there).
    result["events_per_s_from_table"] = round(result["events_in_table"] / result["seconds"])
    events = result["events_per_s"] * result["seconds"]
    result["cpu_us_per_event"] = {
        name: round(seconds / events * 1e6, 1) if events else None
        for name, seconds in cpu.items()}
    if drain:
        result["drain_after_s"] = ingress.wait_drained(dsn)
    return result


@contextmanager
def engine_with_destinations(
    dsn: str, fake: FakeDestination, args: argparse.Namespace,
) -> Iterator[stack.Engine]:
    """The engine, with the two destinations every event fans out to (paused with --hold),
    made through its API."""
    extra = [] if args.ingress_procs is None else ["--ingress-procs", str(args.ingress_procs)]
    with stack.Engine(dsn, args.procs, extra) as engine:
        for name in ("a", "b"):
            created = api_call(engine.base_url, "POST", "/v1/destinations",
                               {"url": fake.url(f"fast/{name}")}, 201)
            if args.hold:
                api_call(engine.base_url, "PATCH", f"/v1/destinations/{created['id']}",
                         {"paused": True}, 200)
        yield engine


def run(args: argparse.Namespace) -> dict[str, Any]:
    tool = load_tool(args.load_tool)
    report: dict[str, Any] = {
        "bench": "ingest-ceiling", "machine": stack.machine(), "git_commit": stack.git_commit(),
        "options": {k: v for k, v in vars(args).items() if k != "reports"} | {
            "load_tool": tool, "dsn": bool(args.dsn)},
    }
    phases: dict[str, Any] = {}
    report["phases"] = phases
    with (stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin,
          stack.fresh_database(admin, BENCH_DB) as dsn,
          FakeDestination(extra_args=["--keep", "0"]) as fake,
          psycopg.connect(dsn, autocommit=True) as conn):
        report["postgres"] = stack.server_report(conn)
        postmaster = stack.postmaster_pid(conn)
        server_before = ingress.tree_cpu_total(postmaster)
        client_before = children_cpu()
        pgbench = run_pgbench(dsn, args.clients, args.duration)
        pgbench["cpu_s"] = {
            "postgres": round(ingress.tree_cpu_total(postmaster) - server_before, 3),
            "load_tool": round(children_cpu() - client_before, 3)}
        phases["pgbench"] = pgbench
        print("pgbench:", json.dumps(pgbench), flush=True)

        with ingress.noop_server() as noop:
            phases["load_tool_alone"] = run_load(
                tool, noop, mode="single", connections=args.clients, seconds=args.duration)
        print("load tool alone:", json.dumps(phases["load_tool_alone"]), flush=True)

        with engine_with_destinations(dsn, fake, args) as engine:
            base = engine.base_url
            ingress_pids = ingress.ingress_pids(engine.pid, engine.port)
            report["engine"] = {"command": engine.command, "ingress_procs": len(ingress_pids)}
            run_load(tool, base, seconds=WARM_UP_S, **ingress.PACED_WRK)
            if not args.hold:
                ingress.wait_drained(dsn)
            parts = {"engine": engine.pid, "postgres": postmaster, "destination": fake.pid}
            phases["single"] = measured(parts, ingress_pids, dsn, lambda: run_load(
                tool, base, mode="single", connections=args.clients, seconds=args.duration),
                drain=not args.hold)
            print("single:", json.dumps(phases["single"]), flush=True)
            phases["batch"] = measured(parts, ingress_pids, dsn, lambda: run_load(
                tool, base, mode="batch", connections=args.batch_connections,
                seconds=args.duration, batch=args.batch), drain=False)
            print("batch:", json.dumps(phases["batch"]), flush=True)
    report["results"] = results(phases)
    report["machine"]["load_average_at_end"] = stack.machine()["load_average"]
    return report


def results(phases: dict[str, Any]) -> dict[str, Any]:
    pgbench = phases["pgbench"]["events_per_s"]
    single = phases["single"]["events_per_s"]
    alone = phases["load_tool_alone"]["requests_per_s"]
    return {
        "pgbench_inserts_per_s": round(pgbench),
        "single_events_per_s": round(single),
        "single_vs_pgbench": round(single / pgbench, 3) if pgbench else None,
        "target_single_vs_pgbench": TARGET_SINGLE_VS_PGBENCH,
        "batch_events_per_s": round(phases["batch"]["events_per_s"]),
        "target_batch_events_per_s": TARGET_BATCH_EVENTS_PER_S,
        "load_tool_alone_requests_per_s": round(alone),
        # Near 1: the load tool, not the engine, set the single-event ceiling.
        "single_vs_load_tool_alone": round(single / alone, 3) if alone else None,
        "load_tool_cores_single": phases["single"]["load_tool_cores"],
        "load_tool_cores_batch": phases["batch"]["load_tool_cores"],
    }


def headline(report: dict[str, Any]) -> list[str]:
    r = report["results"]
    tool = report["options"]["load_tool"]
    return [
        f"pgbench single-row INSERT: {r['pgbench_inserts_per_s']:,}/s"
        f" ({report['options']['clients']} clients)",
        f"engine single events: {r['single_events_per_s']:,}/s = {r['single_vs_pgbench']}x"
        f" pgbench (bar {r['target_single_vs_pgbench']}x); {tool} used"
        f" {r['load_tool_cores_single']} cores, alone it reached"
        f" {r['load_tool_alone_requests_per_s']:,}/s",
        f"engine batch events: {r['batch_events_per_s']:,}/s"
        f" (bar {r['target_batch_events_per_s']:,}/s); {tool} used"
        f" {r['load_tool_cores_batch']} cores",
        f"load average at end: {report['machine']['load_average_at_end']}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ingest-ceiling",
                                     description=__doc__.split("\n\n")[0])
    stack.add_server_arguments(parser)
    parser.add_argument("--duration", type=int, default=20, help="seconds per phase")
    parser.add_argument("--clients", type=int, default=32,
                        help="pgbench clients and the load tool's connections (single)")
    parser.add_argument("--batch-connections", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1000, help="events per batch request")
    parser.add_argument("--procs", type=int, default=2, help="the engine's workers")
    parser.add_argument("--ingress-procs", type=int, help="default: the engine's")
    parser.add_argument("--hold", action="store_true",
                        help="pause both destinations: ingest alone, nothing delivered")
    parser.add_argument("--load-tool", choices=["wrk", "locust"],
                        help="default: wrk if installed, else locust")
    parser.add_argument("--reports", type=Path, default=REPORTS)
    args = parser.parse_args(argv)
    if args.clients < 2:
        parser.error("--clients must be at least 2 (wrk runs 2 threads)")
    report = run(args)
    print(json.dumps(report, indent=2))
    for line in headline(report):
        print(line)
    print(f"report: {save_json(args.reports, 'ingest-ceiling', report)}")
    return 0

"""Ingress bench: accept latency under a steady load, the single-event accept ceiling and
the batch endpoint's events/s, each compared with pgbench single-row 1 KB INSERTs with the
same durability on the same PostgreSQL server.

  python -m bench ingress [--dsn URL | --stock-pg15] [--duration 20] [--procs 2]
                          [--ingress-procs N]

Without --dsn it starts a durable (fsync on) embedded PostgreSQL in a temporary folder.
The engine runs as `engine --procs N` (workers deliver while ingress is measured).
Destinations are fake servers (engine/testing/fakedest.mjs); each event fans out to 2 of
them. Load comes from locust (locustfile.py beside this file) in its own process, and
from wrk (ingress_wrk.lua) when it is installed. Writes bench/reports/ingress-<time>.json
and prints it. Load on this shared machine is noted
(`uptime`) with every number.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import psycopg

from bench.harness import stack
from bench.harness.report import REPORTS, save_json
from engine.testing.fakedest import FakeDestination

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
WRK_SCRIPT = Path(__file__).with_name("ingress_wrk.lua")
NOOP_SERVER = Path(__file__).with_name("noop_server.mjs")
PGBENCH_CLIENTS = 8
PGBENCH_SCRIPT = (
    "INSERT INTO pgbench_single_row (payload) VALUES (repeat('x', 1024));\n"
)
TARGET_RATE = 1000  # events/s for the latency phase
LATENCY_USERS = 50
# The latency phase's load: LATENCY_USERS producers, TARGET_RATE events/s in all. wrk has
# no fixed rate: each connection pauses after each answer.
PACED_LOCUST: dict[str, Any] = {
    "mode": "single", "users": LATENCY_USERS, "user_rps": TARGET_RATE / LATENCY_USERS}
PACED_WRK: dict[str, Any] = {
    "mode": "single", "connections": LATENCY_USERS, "delay_ms": 1000 * LATENCY_USERS / TARGET_RATE}
WARM_UP_S = 5


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def pgbench_bin() -> str:
    for candidate in (
        shutil.which("pgbench"),
        str(Path(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
                 .stdout.strip()) / "pgbench") if shutil.which("pg_config") else None,
    ):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("pgbench not found (install PostgreSQL client tools)")


def run_pgbench(dsn: str, seconds: int) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS pgbench_single_row")
        conn.execute(
            "CREATE TABLE pgbench_single_row (id bigserial PRIMARY KEY, payload text NOT NULL)"
        )
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(PGBENCH_SCRIPT)
    before = load()
    result = subprocess.run(
        [pgbench_bin(), "-n", "-M", "prepared", "-c", str(PGBENCH_CLIENTS), "-j", "2",
         "-T", str(seconds), "-f", script.name, dsn],
        capture_output=True, text=True, check=True,
    )
    os.unlink(script.name)
    tps = float(re.search(r"tps = ([0-9.]+)", result.stdout).group(1))  # type: ignore[union-attr]
    latency = re.search(r"latency average = ([0-9.]+) ms", result.stdout)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE pgbench_single_row")
        # pgbench's WAL would otherwise bring a checkpoint (and full-page writes after
        # it) into the engine's phases.
        conn.execute("CHECKPOINT")
    return {
        "tps": tps, "clients": PGBENCH_CLIENTS, "seconds": seconds,
        "latency_avg_ms": float(latency.group(1)) if latency else None,
        "script": PGBENCH_SCRIPT.strip(), "load_before": before, "load_after": load(),
    }


def post_json(url: str, body: Any) -> Any:
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def run_locust(base_url: str, *, mode: str, users: int, seconds: int, user_rps: float = 0,
               batch: int = 1000) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="engine-locust-") as folder:
        prefix = str(Path(folder) / "run")
        env = {**os.environ, "BENCH_MODE": mode, "BENCH_USER_RPS": str(user_rps),
               "BENCH_BATCH": str(batch)}
        before = load()
        subprocess.run(
            ["locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users), "-r",
             str(users), "-t", f"{seconds}s", "-H", base_url, "--csv", prefix,
             "--only-summary", "--stop-timeout", "10", "--loglevel", "WARNING"],
            env=env, check=False, capture_output=True, timeout=seconds + 120,
        )
        with open(f"{prefix}_stats.csv") as stats:
            rows = {row["Name"]: row for row in csv.DictReader(stats)}
    total = rows["Aggregated"]
    requests = int(total["Request Count"])
    failures = int(total["Failure Count"])
    # Only accepted requests count towards throughput.
    requests_per_s = float(total["Requests/s"]) * (1 - failures / requests if requests else 0)
    per_request = batch if mode == "batch" else 1
    return {
        "mode": mode, "users": users, "seconds": seconds, "user_rps": user_rps,
        "requests": requests, "failures": failures,
        "requests_per_s": requests_per_s, "events_per_s": requests_per_s * per_request,
        "p50_ms": float(total["50%"]), "p99_ms": float(total["99%"]),
        "max_ms": float(total["Max Response Time"]),
        "load_before": before, "load_after": load(),
    }


_WRK_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _wrk_ms(text: str) -> float:
    number, unit = re.fullmatch(r"([0-9.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(number) * _WRK_UNITS[unit]


def run_wrk(base_url: str, *, mode: str, connections: int, seconds: int,
            batch: int = 1000, delay_ms: float = 0) -> dict[str, Any] | None:
    """The same load from wrk (C, nearly free of CPU): shows how much of a locust figure
    is locust's own cost on this small machine. With `delay_ms`, each connection pauses
    that long after each answer (about connections * 1000 / delay_ms requests/s: wrk has
    no fixed rate). None when wrk is not installed."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return None
    env = {**os.environ, "BENCH_MODE": mode, "BENCH_BATCH": str(batch),
           "BENCH_DELAY_MS": str(delay_ms)}
    before = load()
    result = subprocess.run(
        [wrk, "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s",
         str(WRK_SCRIPT), base_url],
        env=env, capture_output=True, text=True, timeout=seconds + 60,
    )
    out = result.stdout
    requests_per_s = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    total = re.search(r"(\d+) requests in", out)
    failures = int(bad.group(1)) if bad else 0
    requests = int(total.group(1)) if total else 0
    if requests:
        requests_per_s *= 1 - failures / requests
    percentiles = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, re.MULTILINE))
    per_request = batch if mode == "batch" else 1
    return {
        "tool": "wrk", "mode": mode, "connections": connections, "seconds": seconds,
        "delay_ms": delay_ms,
        "requests": requests, "failures": failures, "requests_per_s": requests_per_s,
        "events_per_s": requests_per_s * per_request,
        "p50_ms": _wrk_ms(percentiles["50"]) if "50" in percentiles else None,
        "p99_ms": _wrk_ms(percentiles["99"]) if "99" in percentiles else None,
        "load_before": before, "load_after": load(),
        **({} if "99" in percentiles else {"output": out[-2000:]}),
    }


def request_histogram(engine: stack.Engine, route: str = "create_event"
                      ) -> list[tuple[float, float]]:
    """The ingress's own latency histogram of `route` (summed over the ingress processes)."""
    return stack.histogram(engine.metrics_text(), "engine_ingress_request_seconds",
                           f'route="{route}"')


def server_latency(before: list[tuple[float, float]], after: list[tuple[float, float]]
                   ) -> dict[str, Any]:
    """What the server itself measured during a phase (from ASGI call to the answer
    handed to the transport): the bucket bounds p50 and p99 fall under, and the share of
    requests answered within 10 ms. It leaves out the load generator's own delays."""
    found = stack.histogram_quantiles_ms(before, after)
    total = found["count"] or 0.0
    within = dict(after).get(0.01, 0.0) - dict(before).get(0.01, 0.0)
    return {"requests": int(total), "p50_le_ms": found["p50_le_ms"],
            "p99_le_ms": found["p99_le_ms"],
            "share_within_10ms": round(within / total, 4) if total else None}


def tree_cpu_total(pid: int) -> float:
    """CPU seconds of a process, its live children and the children it has reaped: a
    PostgreSQL backend that ended during a phase (pgbench's) still counts."""
    root = psutil.Process(pid)
    times = root.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in root.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue  # ended between the listing and now: in children_* next time
        total += child_times.user + child_times.system
    return total


def own_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def ingress_pids(engine_pid: int, port: int) -> list[int]:
    """The engine's ingress children: the ones holding the listening socket."""
    found = []
    for child in psutil.Process(engine_pid).children():
        try:
            listening = child.net_connections("tcp")
        except psutil.NoSuchProcess:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in listening):
            found.append(child.pid)
    return found


@contextmanager
def noop_server() -> Iterator[str]:
    """noop_server.mjs (beside this file): a server that does no work, for the load
    generator alone."""
    process = subprocess.Popen(["node", str(NOOP_SERVER)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = json.loads(process.stdout.readline())["port"]
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_drained(dsn: str, timeout_s: float = 300.0) -> float:
    """Seconds until the workers have delivered everything accepted (the queue is empty)."""
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() - started < timeout_s:
            row = conn.execute("SELECT EXISTS (SELECT 1 FROM deliveries)").fetchone()
            if row is not None and not row[0]:
                break
            time.sleep(0.2)
    return round(time.monotonic() - started, 2)


def measured(
    servers: dict[str, int], run: Callable[[], dict[str, Any] | None], ops_key: str,
    dsn: str | None = None, ingress: list[int] | None = None,
) -> dict[str, Any] | None:
    """Run a phase and add the CPU seconds it cost each server process tree and the load
    generator, and the server CPU per operation: unlike throughput, that barely depends
    on what else the shared machine is doing. With `dsn`, CPU is counted until the workers
    have delivered all the phase accepted, so each event's delivery is in its phase."""
    before = {name: tree_cpu_total(pid) for name, pid in servers.items()}
    ingress_before = own_cpu(ingress or [])
    client_before = _children_cpu()
    result = run()
    if result is None:
        return None
    if dsn is not None:
        result["drain_after_s"] = wait_drained(dsn)
    cpu = {name: round(tree_cpu_total(pid) - before[name], 3) for name, pid in servers.items()}
    cpu["load_generator"] = round(_children_cpu() - client_before, 3)
    ops = result[ops_key] * result["seconds"]
    if ingress:
        # Part of the engine's figure: the ingress processes alone.
        cpu["engine_ingress"] = round(own_cpu(ingress) - ingress_before, 3)
        result["ingress_cpu_ms_per_op"] = (
            round(cpu["engine_ingress"] / ops * 1000, 4) if ops else None
        )
    result["cpu_s"] = cpu
    result["server_cpu_ms_per_op"] = (
        round(sum(cpu[name] for name in servers) / ops * 1000, 4) if ops else None
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ingress",
                                     description=__doc__.split("\n\n")[0])
    stack.add_server_arguments(parser)
    parser.add_argument("--duration", type=int, default=20, help="seconds per phase")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--ingress-procs", type=int, help="default: the engine's")
    parser.add_argument("--ceiling-users", type=int, default=64)
    parser.add_argument("--batch-users", type=int, default=4)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "bench": "ingress", "machine": stack.machine(), "uptime_at_start": uptime(),
    }
    with (stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin,
          stack.fresh_database(admin, "bench_ingress") as dsn,
          FakeDestination() as fake):
        report["postgres"] = stack.pg_settings(dsn)
        with psycopg.connect(dsn) as conn:
            postgres = {"postgres": stack.postmaster_pid(conn)}
        report["pgbench"] = measured(postgres, lambda: run_pgbench(dsn, args.duration), "tps")
        print("pgbench:", report["pgbench"], flush=True)
        # The latency phase's and the single-event ceiling's load, answered by a server
        # that does nothing: the best any server could show under this load generator on
        # this machine.
        with noop_server() as noop:
            report["load_generator_alone_latency"] = run_locust(
                noop, seconds=args.duration, **PACED_LOCUST)
            client_before = _children_cpu()
            alone = run_locust(noop, mode="single", users=args.ceiling_users,
                               seconds=args.duration)
            alone["load_generator_cpu_s"] = round(_children_cpu() - client_before, 3)
            report["load_generator_alone"] = alone
        print("locust against a no-op server:", report["load_generator_alone_latency"], alone,
              flush=True)
        extra = [] if args.ingress_procs is None else ["--ingress-procs", str(args.ingress_procs)]
        with stack.Engine(dsn, args.procs, extra) as engine:
            base = engine.base_url
            servers = {"engine": engine.pid, **postgres}
            ingress = ingress_pids(engine.pid, engine.port)
            report["engine"] = {"command": engine.command, "procs": args.procs,
                                "ingress_pids": ingress, "ingress_procs": len(ingress)}
            for name in ("a", "b"):
                post_json(f"{base}/v1/destinations", {"url": fake.url(f"fast/{name}")})
            phases = report["phases"] = {}
            # Steady state: the first seconds of a fresh engine (connections opening,
            # statements prepared after a few runs) are not what a producer sees later.
            if run_wrk(base, seconds=WARM_UP_S, **PACED_WRK) is None:
                run_locust(base, seconds=WARM_UP_S, **PACED_LOCUST)
            wait_drained(dsn)
            histogram = request_histogram(engine)
            phases["latency_at_1000_per_s"] = measured(servers, lambda: run_locust(
                base, seconds=args.duration, **PACED_LOCUST,
            ), "events_per_s", dsn, ingress)
            phases["latency_at_1000_per_s"]["server_side"] = server_latency(
                histogram, histogram := request_histogram(engine)
            )
            print("latency:", phases["latency_at_1000_per_s"], flush=True)
            phases["latency_wrk"] = measured(servers, lambda: run_wrk(
                base, seconds=args.duration, **PACED_WRK,
            ), "events_per_s", dsn, ingress)
            if phases["latency_wrk"] is not None:
                phases["latency_wrk"]["server_side"] = server_latency(
                    histogram, request_histogram(engine)
                )
            print("latency (wrk):", phases["latency_wrk"], flush=True)
            # (phase, label, load generator, its arguments)
            ceilings = [
                ("single_ceiling", "ceiling", run_locust,
                 {"mode": "single", "users": args.ceiling_users}),
                ("batch", "batch", run_locust, {"mode": "batch", "users": args.batch_users}),
                ("single_ceiling_wrk", "ceiling (wrk)", run_wrk,
                 {"mode": "single", "connections": args.ceiling_users}),
                ("batch_wrk", "batch (wrk)", run_wrk,
                 {"mode": "batch", "connections": args.batch_users}),
            ]
            for phase, label, generator, options in ceilings:
                phases[phase] = measured(servers, partial(
                    generator, base, seconds=args.duration, **options
                ), "events_per_s", dsn, ingress)
                print(f"{label}:", phases[phase], flush=True)
            report["fakedest"] = {
                name: {k: v for k, v in fake.name_stats(name).items() if not isinstance(v, list)}
                for name in ("a", "b")
            }
    pgbench_tps = report["pgbench"]["tps"]
    phases = report["phases"]
    report["results"] = {
        "latency_p99_ms_at_1000_events_per_s": phases["latency_at_1000_per_s"]["p99_ms"],
        "latency_achieved_events_per_s": phases["latency_at_1000_per_s"]["events_per_s"],
        # The same load against a no-op server: locust's own latency floor.
        "load_generator_alone_p99_ms": report["load_generator_alone_latency"]["p99_ms"],
        # The same phase as the ingress processes measured it, and under wrk's load.
        "latency_server_side": phases["latency_at_1000_per_s"]["server_side"],
        "latency_wrk": {k: phases["latency_wrk"][k] for k in
                        ("events_per_s", "p50_ms", "p99_ms", "server_side")}
        if phases.get("latency_wrk") else None,
        "single_ceiling_events_per_s": phases["single_ceiling"]["events_per_s"],
        "single_vs_pgbench": phases["single_ceiling"]["events_per_s"] / pgbench_tps,
        # Locust's own ceiling (a no-op server) against pgbench: the highest single-event
        # ratio locust can show here, whatever the server.
        "load_generator_alone_vs_pgbench":
            report["load_generator_alone"]["requests_per_s"] / pgbench_tps,
        "batch_events_per_s": phases["batch"]["events_per_s"],
        "batch_vs_pgbench": phases["batch"]["events_per_s"] / pgbench_tps,
        "targets": {"p99_ms": 10, "single_vs_pgbench": 0.5, "batch_vs_pgbench": 2.0},
        # What the ratios would be if each side had the machine's CPU to itself: pgbench's
        # server CPU per transaction over the engine's server CPU per accepted event (the
        # engine's includes delivering it to both destinations).
        "cpu_bound_estimate": {
            name: report["pgbench"]["server_cpu_ms_per_op"]
            / phases[name]["server_cpu_ms_per_op"]
            for name in ("single_ceiling", "batch", "single_ceiling_wrk", "batch_wrk")
            if phases.get(name) and phases[name]["server_cpu_ms_per_op"]
        },
        # Ingress alone (its processes' CPU per event) against pgbench's server CPU per
        # transaction: the delivery work of the workers left out.
        "ingress_cpu_ms_per_event": {
            name: phases[name].get("ingress_cpu_ms_per_op")
            for name in ("single_ceiling", "batch", "single_ceiling_wrk", "batch_wrk")
            if phases.get(name)
        },
        "pgbench_server_cpu_ms_per_txn": report["pgbench"]["server_cpu_ms_per_op"],
        "cross_check_wrk": {
            name: phases[name]["events_per_s"] / pgbench_tps
            for name in ("single_ceiling_wrk", "batch_wrk") if phases.get(name)
        },
    }
    report["uptime_at_end"] = uptime()
    results = report["results"]
    markdown = (
        f"ingress ({report['engine']['ingress_procs']} procs):"
        f" p99 {results['latency_p99_ms_at_1000_events_per_s']} ms at"
        f" {results['latency_achieved_events_per_s']:.0f} events/s"
        f" (locust alone {results['load_generator_alone_p99_ms']} ms;"
        f" server side p99 <= {results['latency_server_side']['p99_le_ms']} ms"
        + (f", wrk p99 {results['latency_wrk']['p99_ms']} ms" if results["latency_wrk"] else "")
        + ");"
        f" single {results['single_ceiling_events_per_s']:.0f}/s"
        f" ({results['single_vs_pgbench']:.2f}x pgbench {pgbench_tps:.0f} TPS; locust alone"
        f" {report['load_generator_alone']['requests_per_s']:.0f}/s ="
        f" {results['load_generator_alone_vs_pgbench']:.2f}x);"
        f" batch {results['batch_events_per_s']:.0f}/s ({results['batch_vs_pgbench']:.2f}x);"
        f" load {report['uptime_at_end'].split('load average: ')[-1]}"
    )
    print(json.dumps(report, indent=2))
    print(markdown)
    print(f"report: {save_json(REPORTS, 'ingress', report)}")
    return 0


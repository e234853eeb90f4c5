"""Stress of the hostile mix, for issue 37 (docs/decisions/0020-*.md): a real
`engine --procs 2` delivering for --minutes to every hostile behaviour of
tests/kit/hostile_servers.py on --hosts loopback addresses (127.0.0.2, .3, ...), beside
healthy keep-alive destinations whose server closes idle connections after a random
moment (sometimes with a reset), refused ports, a TLS host nobody trusts and an
unresolvable name; --load busy loops keep both cores loaded. Everything is on loopback:
the servers bind 127.0.0.x, and the engine runs in a private mount namespace whose
resolv.conf names a closed loopback port (as the hostile soak does; needs root and
unshare).

From the repository root, with the test extras installed:

    python -m tools.hostile_stress --minutes 10 [--runs 10] [--hosts 6] [--load 2] [--out DIR]

Each run is a fresh engine on a fresh database; with --runs N the last line totals them.

Counts what the issue asks about and prints them as one JSON line at the end (and into
DIR/summary.json): worker exits (the supervisor's child_exited events with their signal,
but for the exit code 0 of the final drain); the client's tolerated faults
(`http_client_fault` lines, the first of each kind per CurlPool, and the totals of
worker_drained's `http_client_faults`); pycurl's "failed to acquire thread" warnings and
faulthandler's "Fatal Python error" reports. Workers run with PYTHONFAULTHANDLER=1 and
unlimited core files (written to DIR as the kernel's core_pattern permits) for the
native stack: `gdb python DIR/core`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from engine.db import queries, queue_async
from engine.domain import EventIn
from engine.testing.fakedest import FakeDestination
from engine.testing.processes import stop_process
from tests.kit.data import add_destination
from tests.kit.dbserver import DatabaseFactory, test_server
from tests.kit.hostile_servers import HostileServer, TlsServer, _Handler
from tests.kit.httpserver_helpers import closed_port
from tests.test_hostile_destinations import isolated_dns_prefix

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ["reset-headers", "reset-body", "garbage", "http09", "drip", "hang", "huge",
           "redirect"]
HEALTHY = ["healthy", "healthy-slow", "idle-close"]
HOSTILE_TIMEOUT_MS = 1500


class _IdleClosingHandler(_Handler):
    """`idle-close`: 200 with keep-alive, then the connection is closed by the server if
    the client sends nothing for a random 0.05-1 s (a reset one time in three): cached
    connections die while libcurl still holds them."""

    def answer(self, sock: socket.socket, behaviour: str, path: str) -> bool:
        if behaviour != "idle-close":
            return super().answer(sock, behaviour, path)
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        sock.settimeout(random.uniform(0.05, 1.0))
        try:
            sock.recv(1, socket.MSG_PEEK)  # the next request, or EOF
        except TimeoutError:
            if random.random() < 1 / 3:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        sock.settimeout(None)
        return True


class StressServer(HostileServer):
    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.RequestHandlerClass = _IdleClosingHandler


def serve(hosts: list[str], folder: Path) -> None:
    """The servers' process: prints {host: port} and {"tls": url}, then serves until killed."""
    servers = [StressServer(host) for host in hosts]
    tls = TlsServer(folder)
    for server in [*servers, tls]:
        server.__enter__()
    print(json.dumps({"ports": {s.server_address[0]: s.server_address[1] for s in servers},
                      "tls": tls.url()}), flush=True)
    while True:  # until the stress ends this process (SIGTERM)
        time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of one run")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--hosts", type=int, default=6, help="loopback hosts, 127.0.0.2 on")
    parser.add_argument("--server-procs", type=int, default=2)
    parser.add_argument("--hostile-per-destination", type=int, default=6,
                        help="deliveries per hostile destination, retried all run long")
    parser.add_argument("--healthy-per-s", type=int, default=60,
                        help="events per second fanned out to every healthy destination")
    parser.add_argument("--max-in-flight", type=int, default=1024)
    parser.add_argument("--load", type=int, default=2, help="busy-loop processes beside")
    parser.add_argument("--out", type=Path, help="folder for the logs (default: a new one)")
    parser.add_argument("--serve", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, Path(tempfile.mkdtemp(prefix="hostile-stress-tls-")))
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="hostile-stress-"))
    total: Counter[str] = Counter()
    minutes = 0.0
    for number in range(1, args.runs + 1):
        folder = out / f"run-{number}" if args.runs > 1 else out
        folder.mkdir(parents=True, exist_ok=True)
        summary = run(args, folder)
        (folder / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary), flush=True)
        total["runs"] += 1
        total["worker_exits"] += len(summary["worker_exits"])
        total["client_faults"] += sum(summary["client_faults_total_at_drain"].values())
        total["pools_with_client_faults"] += sum(
            summary["client_faults_first_per_pool"].values())
        total["fatal_errors_and_warnings"] += sum(summary["other"].values())
        minutes += summary["minutes"]
    if args.runs > 1:
        print(json.dumps({"total": {"minutes": round(minutes, 2), **total}}), flush=True)


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    started: list[subprocess.Popen[bytes]] = []
    hosts = [f"127.0.0.{2 + i}" for i in range(args.hosts)]
    try:
        servers: dict[str, Any] = {"ports": {}, "tls": []}
        for part in range(args.server_procs):
            proc = subprocess.Popen(
                [sys.executable, "-m", "tools.hostile_stress", "--serve",
                 *hosts[part::args.server_procs]],
                cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
            started.append(proc)  # type: ignore[arg-type]
            assert proc.stdout is not None
            answer = json.loads(proc.stdout.readline())
            servers["ports"] |= answer["ports"]
            servers["tls"].append(answer["tls"])
        for _ in range(args.load):
            started.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        with test_server() as admin_dsn, FakeDestination() as fake:
            dsn = DatabaseFactory(admin_dsn).create()
            with psycopg.connect(dsn, autocommit=True) as conn:
                return stress(args, out, dsn, conn, servers, fake)
    finally:
        for proc in started:  # only what this run started, by PID
            proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def enqueue(conn: psycopg.Connection, events: list[EventIn]) -> None:
    """Ingress's insert (queue_async.enqueue_events' statement and parameters) on this
    autocommit connection: one statement, committed when it returns."""
    queries.ENQUEUE_EVENTS.run_sync(conn, queue_async.enqueue_params(events))


def stress(args: argparse.Namespace, out: Path, dsn: str, conn: psycopg.Connection,
           servers: dict[str, Any], fake: FakeDestination) -> dict[str, Any]:
    def url(host: str, behaviour: str, name: str = "x") -> str:
        return f"http://{host}:{servers['ports'][host]}/{behaviour}/{name}"

    hostile_ids: dict[int, str] = {}
    healthy_ids: dict[int, str] = {}
    for host in servers["ports"]:
        for behaviour in HOSTILE:
            hostile_ids[add_destination(conn, url=url(host, behaviour), event_types=["hostile"],
                                        timeout_ms=HOSTILE_TIMEOUT_MS)] = behaviour
        for behaviour in HEALTHY:
            for n in range(2):
                healthy_ids[add_destination(conn, url=url(host, behaviour, str(n)),
                                            event_types=["tick"])] = behaviour
        hostile_ids[add_destination(conn, url=f"http://{host}:{closed_port()}/hook",
                                    event_types=["hostile"],
                                    timeout_ms=HOSTILE_TIMEOUT_MS)] = "refused"
    for tls in servers["tls"]:
        hostile_ids[add_destination(conn, url=tls, event_types=["hostile"],
                                    timeout_ms=HOSTILE_TIMEOUT_MS)] = "tls"
    hostile_ids[add_destination(conn, url="http://nothing-here.invalid/hook",
                                event_types=["hostile"], timeout_ms=HOSTILE_TIMEOUT_MS)] = "dns"
    for n in range(4):
        node = add_destination(conn, url=fake.url(f"fast/f{n}"), event_types=["tick"])
        healthy_ids[node] = "node"
    config = out / "engine.toml"
    config.write_text("breaker_threshold = 1000000\n")
    schedule = ",".join(["400ms"] * 10000)
    log_path = out / "engine.log"
    argv = [*isolated_dns_prefix(out), sys.executable, "-m", "engine.cli", "--dsn", dsn,
            "--config", str(config), "--procs", "2", "--bind", "127.0.0.1:0",
            "--allow-private-targets", "--retry-schedule", schedule,
            "--max-in-flight", str(args.max_in_flight)]

    def unlimited_core() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2)

    began = time.monotonic()
    ticks = 0
    with log_path.open("wb") as log:
        engine = subprocess.Popen(argv, cwd=out, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=log, preexec_fn=unlimited_core,
                                  env={**os.environ, "PYTHONFAULTHANDLER": "1",
                                       "PYTHONPATH": str(ROOT)})
        try:
            enqueue(conn, [EventIn("hostile", '{"h":1}')] * args.hostile_per_destination)
            per_tick = max(1, args.healthy_per_s // 10)
            while time.monotonic() - began < args.minutes * 60:
                if engine.poll() is not None:
                    break
                enqueue(conn, [EventIn("tick", f'{{"n":{ticks}}}')] * per_tick)
                ticks += per_tick
                time.sleep(0.1)
        finally:
            stop_process(engine, 60)
    ran_s = time.monotonic() - began
    return summarize(log_path, conn, ran_s, ticks, hostile_ids, healthy_ids, out)


def summarize(log_path: Path, conn: psycopg.Connection, ran_s: float, ticks: int,
              hostile_ids: dict[int, str], healthy_ids: dict[int, str],
              out: Path) -> dict[str, Any]:
    exits, faults, drained = [], Counter[str](), Counter[str]()
    other = Counter[str]()
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            event = record.get("event")
            if event == "child_exited" and record.get("role") == "worker" and (
                    record.get("signal") or record.get("exit_code")):  # not a drain's 0
                exits.append({k: record.get(k)
                              for k in ("child", "signal", "exit_code", "lived_s")})
            elif event == "http_client_fault":
                faults[record["kind"]] += 1
            elif event == "worker_drained":
                drained.update(record.get("http_client_faults") or {})
            elif event == "http_client_rebuilt":
                other["http_client_rebuilt"] += 1
        elif "failed to acquire thread" in line:
            other[line.split("RuntimeWarning: ")[-1].strip()] += 1
        elif line.startswith("Fatal Python error"):
            other[line.strip()] += 1
    errors: dict[str, Counter[str]] = {}
    for destination_id, error, count in conn.execute(
            "SELECT d.destination_id, coalesce(a.error, 'HTTP ' || a.status_code), count(*)"
            " FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id"
            " GROUP BY 1, 2"):
        name = hostile_ids.get(destination_id, healthy_ids.get(destination_id, "?"))
        errors.setdefault(name, Counter())[error] += count
    delivered = conn.execute("SELECT count(*) FROM finished_deliveries"
                             " WHERE status = 'delivered'").fetchone()
    return {
        "minutes": round(ran_s / 60, 2), "worker_exits": exits,
        "client_faults_first_per_pool": dict(faults),
        "client_faults_total_at_drain": dict(drained), "other": dict(other),
        "healthy_events": ticks, "healthy_delivered": delivered[0] if delivered else None,
        "hostile_attempt_errors": {k: dict(v) for k, v in sorted(errors.items())},
        "cores": sorted(p.name for p in out.glob("core*")), "out": str(out),
    }


if __name__ == "__main__":
    main()

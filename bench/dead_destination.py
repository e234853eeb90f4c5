"""Dead-destination bench: does one endpoint that never answers slow everyone else down?

    python bench/dead_destination.py [--dsn URL] [--procs 2] [--count N] [--window 30]

Two runs of `engine --procs 2` on a fresh database each, from a preloaded backlog large
enough to keep the engine busy for the whole window:
- baseline: N healthy deliveries to an endpoint answering after 50 ms;
- dead: the same N healthy deliveries, interleaved with N/4 more (20 % of all) to an
  endpoint that never answers (destination timeout 10 s).
Reported per run: healthy deliveries/s over the first `window` seconds after the first
request (or until the last one, if the backlog ran out sooner), the longest stretch in
that window with no healthy delivery (a stall: healthy deliveries waiting behind dead
ones), how many requests the dead endpoint held at once and the breaker state it ended
in; then the ratio dead/baseline (target >= 0.90). Without --dsn a durable PostgreSQL is
started in a temporary folder. JSON on stdout and under bench/reports/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from engine import queue
from engine.embedded import ensure_server
from engine.queue import EventIn
from engine.testing.fakedest import FakeDestination

from drain import PAYLOAD, SECRET, fresh_database

ROOT = Path(__file__).resolve().parents[1]

ENQUEUE_BATCH = 5000
DEAD_TIMEOUT_MS = 10_000


def add_destination(conn: psycopg.Connection, url: str, timeout_ms: int = 10_000) -> int:
    row = conn.execute(
        "INSERT INTO destinations (url, secret, timeout_ms) VALUES (%s, %s, %s) RETURNING id",
        (url, SECRET, timeout_ms),
    ).fetchone()
    assert row is not None
    return int(row[0])


def run(admin_dsn: str, args: argparse.Namespace, with_dead: bool) -> dict[str, object]:
    dsn = fresh_database(admin_dsn)
    with (
        FakeDestination(extra_args=["--keep", "0"]) as fake,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        healthy = add_destination(conn, fake.url("slow/50/healthy"))
        dead = add_destination(conn, fake.url("dead/dead"), DEAD_TIMEOUT_MS)
        # One dead delivery after every fourth healthy one: 20 % of all, spread evenly.
        targets = []
        for i in range(args.count):
            targets.append(healthy)
            if with_dead and i % 4 == 3:
                targets.append(dead)
        for start in range(0, len(targets), ENQUEUE_BATCH):
            with conn.transaction():
                queue.enqueue_events(conn, [
                    EventIn("order.created", PAYLOAD, [t])
                    for t in targets[start:start + ENQUEUE_BATCH]
                ])
        conn.execute("VACUUM ANALYZE deliveries, events, destinations")
        command = [
            sys.executable, "-m", "engine.cli", "--dsn", dsn, "--procs", str(args.procs),
            "--allow-private-targets", "--bind", "127.0.0.1:0",
        ]
        load_before = os.getloadavg()
        engine = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.DEVNULL)
        try:
            started = time.monotonic()
            while not fake.name_stats("healthy").get("first_request_ms"):
                if time.monotonic() - started > 60:
                    raise RuntimeError("the engine sent nothing within 60 s")
                time.sleep(0.05)
            first_ms = int(fake.name_stats("healthy")["first_request_ms"])
            while time.time() * 1000 < first_ms + args.window * 1000 + 500:
                time.sleep(0.2)
            arrivals = sorted(fake.arrivals("healthy").values())
            dead_stats = fake.name_stats("dead")
            breaker = conn.execute(
                "SELECT breaker::text, consecutive_failures FROM destinations WHERE id = %s",
                [dead],
            ).fetchone()
            load_after = os.getloadavg()
        finally:
            engine.send_signal(signal.SIGTERM)
            engine.wait(90)
    end_ms = first_ms + args.window * 1000
    in_window = [ms for ms in arrivals if ms < end_ms]
    if len(in_window) == args.count:  # the backlog ran out: measure up to its last delivery
        end_ms = in_window[-1]
    span_s = (end_ms - first_ms) / 1000
    stall_ms = max(b - a for a, b in zip([first_ms, *in_window], [*in_window, end_ms],
                                          strict=True))
    return {
        "run": "dead" if with_dead else "baseline",
        "healthy_backlog": args.count,
        "dead_backlog": len(targets) - args.count,
        "window_s": args.window,
        "healthy_delivered_in_window": len(in_window),
        "measured_s": round(span_s, 3),
        "healthy_per_s": round(len(in_window) / span_s, 1),
        "backlog_lasted_whole_window": len(in_window) < args.count,
        "longest_healthy_stall_ms": stall_ms,
        "dead_endpoint_max_concurrent": dead_stats.get("max_concurrent") if with_dead else None,
        "dead_endpoint_requests": dead_stats.get("requests") if with_dead else None,
        "dead_breaker_at_end": list(breaker) if with_dead and breaker else None,
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "engine_command": " ".join(command[1:]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="PostgreSQL server to use (a database is created on it)")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--count", type=int, default=250_000, help="healthy deliveries")
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured")
    args = parser.parse_args()
    folder = server = None
    admin_dsn = args.dsn
    if admin_dsn is None:
        folder = Path(tempfile.mkdtemp(prefix="engine-bench-pg-"))
        server = ensure_server(folder / "data", durable=True)
        admin_dsn = server.dsn
    try:
        baseline = run(admin_dsn, args, with_dead=False)
        dead = run(admin_dsn, args, with_dead=True)
    finally:
        if server is not None:
            server.stop()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    ratio = dead["healthy_per_s"] / baseline["healthy_per_s"]  # type: ignore[operator]
    report = {
        "scenario": "dead-destination",
        "ratio_healthy_per_s": round(ratio, 3),
        "target_ratio": 0.9,
        "met": ratio >= 0.9,
        "baseline": baseline,
        "dead": dead,
        "cpus": os.cpu_count(),
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    text = json.dumps(report, indent=2)
    print(text, flush=True)
    reports = ROOT / "bench" / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    (reports / f"dead-destination-{stamp}.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One ingress process on its own, under wrk: its CPU per accepted event and what it
sustains when no workers share the machine (bench/ingress.py measures the whole engine).

  python bench/ingress_alone.py [single|batch|paced] [--seconds 10] [--dsn URL]

`python -m engine.ingress.server` on a durable (fsync on) embedded PostgreSQL, two
destinations that nothing delivers to (each event still gets its 2 deliveries written).
`single`: 64 connections posting one event each as fast as answered; `batch`: 4
connections posting 1000 events; `paced`: 50 connections each waiting 50 ms after an
answer (about 1000 events/s). Prints one JSON line: requests/s, CPU of the ingress
process per event, wrk's latency percentiles and the server's own latency histogram.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import psycopg

from engine.testing.ingress_server import IngressProcess

# Run from a checkout without installing the package.
from benchdb import fresh_database, server
from ingress import load, request_histogram, server_latency

ROOT = Path(__file__).resolve().parents[1]
WRK_SCRIPT = ROOT / "bench" / "ingress_wrk.lua"
# mode: (connections, events per request, delay after each answer in ms)
MODES = {"single": (64, 1, 0), "batch": (4, 1000, 0), "paced": (50, 1, 50)}
SECRET = "whsec_" + "A" * 43 + "="


def wrk(url: str, mode: str, seconds: int) -> str:
    connections, per_request, delay_ms = MODES[mode]
    env = {**os.environ, "BENCH_MODE": "batch" if per_request > 1 else "single",
           "BENCH_DELAY_MS": str(delay_ms)}
    return subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s",
         str(WRK_SCRIPT), url],
        env=env, capture_output=True, text=True, check=True, timeout=seconds + 60,
    ).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="single", choices=MODES)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--dsn", help="admin DSN of a server to bench on (default: embedded)")
    args = parser.parse_args()
    with server(args.dsn) as admin, fresh_database(admin, "bench_ingress_alone") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in ("a", "b"):
                conn.execute("INSERT INTO destinations (url, secret) VALUES (%s, %s)",
                             (f"http://127.0.0.1:9/{name}", SECRET))
        with IngressProcess(dsn) as ingress:
            assert ingress.proc is not None
            url = f"http://127.0.0.1:{ingress.port}"
            process = psutil.Process(ingress.proc.pid)
            wrk(url, "single", 2)  # warm up: connections, prepared statements
            route = "create_event_batch" if args.mode == "batch" else "create_event"
            histogram = request_histogram(url, route)
            load_before = load()
            cpu_before = sum(process.cpu_times()[:2])
            out = wrk(url, args.mode, args.seconds)
            cpu = sum(process.cpu_times()[:2]) - cpu_before
            server_side = server_latency(histogram, request_histogram(url, route))
            with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
                metrics = response.read().decode()
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    per_second = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    per_request = MODES[args.mode][1]
    commits = re.search(r"^engine_ingress_commit_requests_count (\S+)$", metrics, re.MULTILINE)
    result = {
        "mode": args.mode, "seconds": args.seconds, "requests": requests,
        "non_2xx": int(bad.group(1)) if bad else 0,
        "events_per_s": round(per_second * per_request),
        "ingress_cpu_us_per_event": round(cpu / (requests * per_request) * 1e6, 1),
        "wrk_latency": dict(re.findall(r"^\s+(50|90|99)%\s+(\S+)$", out, re.MULTILINE)),
        "server_side": server_side,
        "commits_since_start": float(commits.group(1)) if commits else None,
        "load_before": load_before, "load_after": load(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

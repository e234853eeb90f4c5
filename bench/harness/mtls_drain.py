"""`python -m bench mtls-drain`: a backlog drained to an HTTPS destination that demands a
client certificate, against the same destination over plain TLS, in one run (issue 42's
bar: mutual TLS drains at >= 80 % of plain TLS).

One engine (`--procs`, default 2) runs throughout and one Node process
(bench/harness/tls_server.mjs) serves both destinations: the same server certificate
from a private CA, the same handler answering 200 at once; `mtls` also demands a client
certificate from that CA. Both destinations have egress settings (the private CA as
`tls.ca_bundle`; `mtls` also `tls.client_cert` and `client_key`), so a claim takes the
same path in the worker for both and only the client certificate differs. One unmeasured
warm-up run of each opens the connections; then the runs alternate tls, mtls, ...
`--repeat` times each. A run commits `--count` deliveries at once and waits until all are
finished. Reported per run: deliveries/s (commit to the last finished), CPU ms per
delivery of the engine, PostgreSQL and the destination process trees, and the TLS
handshakes the destination saw (connections are reused: a handful per run at most); per
mode the median; and the ratio of the medians' rates, mtls / tls. JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import psycopg
import trustme

from bench.harness import stack
from bench.harness.drain import enqueue_backlog

MODES = ("tls", "mtls")
SERVER = Path(__file__).with_name("tls_server.mjs")
RUN_TIMEOUT_S = 600.0
MAX_IN_FLIGHT = 64  # per destination (see where the destinations are made)


def start_destinations(folder: Path, ca: trustme.CA) -> tuple[subprocess.Popen[bytes],
                                                               dict[str, int]]:
    """tls_server.mjs with a certificate for 127.0.0.1 from `ca`; its ports by name."""
    node = shutil.which("node")
    if node is None:
        raise stack.BenchError("mtls-drain needs Node.js: apt-get install -y nodejs")
    leaf = ca.issue_cert("127.0.0.1")
    files = {"cert": leaf.cert_chain_pems[0], "key": leaf.private_key_pem, "ca": ca.cert_pem}
    argv = [node, str(SERVER)]
    for name, blob in files.items():
        blob.write_to_path(str(folder / f"{name}.pem"))
        argv += [f"--{name}", str(folder / f"{name}.pem")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise stack.BenchError(f"tls_server.mjs exited at start (code {proc.wait()})")
    return proc, json.loads(line)


def destination_stats(stats_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{stats_port}/_stats", timeout=10) as resp:
        return json.load(resp)  # type: ignore[no-any-return]


def finished(db: psycopg.Connection, destination: int) -> int:
    row = db.execute("SELECT count(*) FROM finished_deliveries WHERE destination_id = %s",
                     [destination]).fetchone()
    assert row is not None
    return int(row[0])


def run(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench mtls-drain",
                                     description=__doc__.split("\n\n")[0])
    stack.add_server_arguments(parser)
    parser.add_argument("--count", type=int, default=20_000, help="deliveries per run")
    parser.add_argument("--repeat", type=int, default=3, help="measured runs of each mode")
    parser.add_argument("--procs", type=int, default=2, help="engine delivery workers")
    args = parser.parse_args(argv)
    ca = trustme.CA()
    client = ca.issue_cert("engine-client.example")
    with tempfile.TemporaryDirectory() as folder, \
            stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin_dsn, \
            stack.fresh_database(admin_dsn, "engine_bench_mtls_drain") as dsn, \
            psycopg.connect(dsn, autocommit=True) as db:
        node, ports = start_destinations(Path(folder), ca)
        try:
            destinations: dict[str, int] = {}
            for mode in MODES:
                tls: dict[str, Any] = {"tls_ca_bundle": ca.cert_pem.bytes().decode()}
                if mode == "mtls":
                    tls["tls_client_cert"] = client.cert_chain_pems[0].bytes().decode()
                    tls["tls_client_key"] = client.private_key_pem.bytes().decode()
                # Capped so that both destinations' connections fit in the worker's
                # connection caches together (SPREAD = 128 per pool): uncapped, each run
                # opens about 1,000 and evicts the other mode's, and every run measures
                # handshakes instead of reused connections.
                columns = {"url": f"https://127.0.0.1:{ports[mode]}/hook",
                           "secret": stack.SECRET, "max_in_flight": MAX_IN_FLIGHT, **tls}
                row = db.execute(
                    f"INSERT INTO destinations ({', '.join(columns)}, egress_revision)"
                    f" VALUES ({', '.join(['%s'] * len(columns))},"
                    "          nextval('egress_revision_seq')) RETURNING id",
                    list(columns.values())).fetchone()
                assert row is not None
                destinations[mode] = int(row[0])
            postgres = stack.postmaster_pid(db)
            with stack.Engine(dsn, args.procs) as engine:
                meter = stack.CpuMeter({"engine": [engine.pid], "postgres": [postgres],
                                        "destination": [node.pid]})
                runs: list[dict[str, Any]] = []
                for round_ in range(args.repeat + 1):
                    for mode in MODES:
                        result = drain_once(db, destinations[mode], mode, args.count,
                                            ports["stats"], meter)
                        result["warm_up"] = round_ == 0
                        runs.append(result)
                        print(json.dumps(result), file=sys.stderr, flush=True)
        finally:
            node.terminate()
            node.wait()
    summary: dict[str, Any] = {}
    for mode in MODES:
        measured = [r for r in runs if r["mode"] == mode and not r["warm_up"]]
        summary[mode] = {
            "median_deliveries_per_s": statistics.median(r["deliveries_per_s"] for r in measured),
            "median_engine_cpu_ms_per_delivery": statistics.median(
                r["cpu_ms_per_delivery"]["engine"] for r in measured),
            "handshakes": [r["handshakes"] for r in measured],
        }
    summary["rate_ratio_mtls_to_tls"] = (summary["mtls"]["median_deliveries_per_s"]
                                         / summary["tls"]["median_deliveries_per_s"])
    print(json.dumps({"scenario": "mtls-drain", "count": args.count, "procs": args.procs,
                      "commit": stack.git_commit(), "machine": stack.machine(),
                      "summary": summary, "runs": runs}, indent=1))
    return 0


def drain_once(db: psycopg.Connection, destination: int, mode: str, count: int,
               stats_port: int, meter: stack.CpuMeter) -> dict[str, Any]:
    """Commit `count` deliveries to `destination`, wait until all are finished."""
    done_before = finished(db, destination)
    before = destination_stats(stats_port)[mode]
    meter.take()
    started = time.monotonic()
    enqueue_backlog(db.info.dsn, destination, count)
    deadline = started + RUN_TIMEOUT_S
    while finished(db, destination) < done_before + count:
        if time.monotonic() > deadline:
            raise stack.BenchError(f"{mode}: not drained in {RUN_TIMEOUT_S:.0f} s")
        meter.poll()
        time.sleep(0.02)
    wall_s = time.monotonic() - started
    cpu = meter.take()
    after = destination_stats(stats_port)[mode]
    delivered = db.execute(
        "SELECT count(*) FROM finished_deliveries WHERE destination_id = %s"
        " AND status = 'delivered'", [destination]).fetchone()
    return {
        "mode": mode, "count": count, "wall_s": round(wall_s, 3),
        "deliveries_per_s": round(count / wall_s),
        "cpu_ms_per_delivery": {part: round(1000 * seconds / count, 4)
                                for part, seconds in cpu.items()},
        "handshakes": after["handshakes"] - before["handshakes"],
        "requests": after["requests"] - before["requests"],
        "delivered_total": delivered[0] if delivered else None,
        "load_average": psutil.getloadavg(),
    }


def main(argv: Sequence[str]) -> int:
    try:
        return run(argv)
    except stack.BenchError as exc:
        print(f"bench mtls-drain: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

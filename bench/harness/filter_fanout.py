"""`python -m bench filter-fanout`: the CPU per event of fanning a 1 KB event out to a
tenant's 1,000 destinations, each with a filter of 5 conditions, against the same fan-out
without filters (issue 41's bar: at most 1.5x), in one run.

Two tenants on one ingress process and one PostgreSQL server: `plain` (1,000 destinations,
no filter) and `filtered` (1,000 destinations whose 5-condition filters all admit the
event, so both fan out to the same 1,000 deliveries and only the filters differ). Runs
alternate plain, filtered, ... `--repeat` times each after one unmeasured warm-up of each;
a run posts `--events` single events one after another and measures the CPU of the ingress
process and of the whole PostgreSQL server (its process tree) over them. The deliveries
are emptied between runs, so every run inserts into tables of the same size. Prints one
JSON document: every run, and per mode the median and spread (max - min) of CPU per event.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import psutil
import psycopg

from bench.harness import stack
from engine.testing.ingress_server import IngressProcess

DESTINATIONS = 1000
MODES = ("plain", "filtered")


def destination_filter(n: int) -> dict[str, Any]:
    """Five conditions, each true of `event_payload()`, different per destination."""
    return {
        "customer.tier": {"$in": ["gold", "platinum"]},
        "customer.id": {"$exists": True},
        "items.0.qty": {"$gte": 1 + n % 3},
        "total_cents": {"$gt": n},
        "currency": {"$neq": f"XX{n}"},
    }


def event_payload() -> bytes:
    """About 1 KB of JSON that every destination_filter admits."""
    payload = {
        "id": "ord_0123456789", "total_cents": 125_000, "currency": "EUR",
        "customer": {"id": "cus_42", "tier": "gold", "email": "someone@example.com",
                     "name": "Someone Example"},
        "items": [{"sku": f"sku-{n:04d}", "qty": 3, "price_cents": 4200 + n,
                   "title": "a product with a reasonably long title"} for n in range(6)],
        "note": "x" * 200,
    }
    body = json.dumps(payload).encode()
    assert 900 <= len(body) <= 1100, len(body)
    return body


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> dict[str, Any]:
    conn.request("POST", path, body=body, headers={"content-type": "application/json"})
    answer = conn.getresponse()
    data = answer.read()
    if answer.status not in (201, 202):
        raise stack.BenchError(f"POST {path}: {answer.status} {data[:200]!r}")
    return json.loads(data)


def tree_cpu(process: psutil.Process) -> float:
    """User + system seconds of a process and its live children."""
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def run(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench filter-fanout",
                                     description=__doc__.split("\n\n")[0])
    stack.add_server_arguments(parser)
    parser.add_argument("--events", type=int, default=200, help="events per run")
    parser.add_argument("--repeat", type=int, default=3, help="measured runs of each mode")
    args = parser.parse_args(argv)
    event = event_payload()
    with stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin_dsn, \
            stack.fresh_database(admin_dsn, "engine_bench_filter_fanout") as dsn, \
            IngressProcess(dsn) as ingress, psycopg.connect(dsn, autocommit=True) as db:
        postgres = psutil.Process(stack.postmaster_pid(db))
        assert ingress.proc is not None
        ingress_process = psutil.Process(ingress.proc.pid)
        client = http.client.HTTPConnection("127.0.0.1", ingress.port, timeout=60)
        for mode in MODES:
            post(client, "/v1/tenants", json.dumps({"uid": mode}).encode())
            for n in range(DESTINATIONS):
                body: dict[str, Any] = {"url": f"http://127.0.0.1:9/{mode}/{n}"}
                if mode == "filtered":
                    body["filter"] = destination_filter(n)
                post(client, f"/v1/tenants/{mode}/destinations", json.dumps(body).encode())
        request = b'{"type": "order.created", "payload": ' + event + b"}"
        runs: list[dict[str, Any]] = []
        for round_ in range(args.repeat + 1):
            for mode in MODES:
                db.execute("TRUNCATE deliveries")
                db.execute("CHECKPOINT")
                ingress_before, pg_before = tree_cpu(ingress_process), tree_cpu(postgres)
                started = time.perf_counter()
                deliveries = 0
                for _ in range(args.events):
                    deliveries += post(client, f"/v1/tenants/{mode}/events", request)[
                        "deliveries"]
                wall = time.perf_counter() - started
                ingress_cpu = tree_cpu(ingress_process) - ingress_before
                pg_cpu = tree_cpu(postgres) - pg_before
                if deliveries != args.events * DESTINATIONS:
                    raise stack.BenchError(f"{mode}: {deliveries} deliveries, expected"
                                           f" {args.events * DESTINATIONS}")
                result = {
                    "mode": mode, "round": round_, "warm_up": round_ == 0,
                    "events": args.events, "wall_ms_per_event": 1000 * wall / args.events,
                    "ingress_cpu_ms_per_event": 1000 * ingress_cpu / args.events,
                    "pg_cpu_ms_per_event": 1000 * pg_cpu / args.events,
                    "cpu_ms_per_event": 1000 * (ingress_cpu + pg_cpu) / args.events,
                    "load_average": psutil.getloadavg(),
                }
                runs.append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)
        client.close()
    summary: dict[str, Any] = {}
    for mode in MODES:
        measured = [r["cpu_ms_per_event"] for r in runs if r["mode"] == mode and not r["warm_up"]]
        summary[mode] = {"median_cpu_ms_per_event": statistics.median(measured),
                         "spread_cpu_ms": max(measured) - min(measured), "runs": measured}
    summary["ratio_filtered_to_plain"] = (summary["filtered"]["median_cpu_ms_per_event"]
                                          / summary["plain"]["median_cpu_ms_per_event"])
    print(json.dumps({"scenario": "filter-fanout", "destinations": DESTINATIONS,
                      "payload_bytes": len(event), "summary": summary, "runs": runs}, indent=1))
    return 0


def main(argv: Sequence[str]) -> int:
    try:
        return run(argv)
    except stack.BenchError as exc:
        print(f"bench filter-fanout: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

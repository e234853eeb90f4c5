"""Ingest cost of an event-type schema (issue 40: at most 15 % more ingress CPU per event).

  python -m bench event-schema-cost [--dsn URL] [--duration 10] [--rounds 3]
                                    [--connections 16]

One ingress process (engine.ingress.server, as the tests run it) on a fresh database.
Two event types: `bench.schema`, in the catalog with a JSON Schema of 20 properties
(strings, integers, enums, nested objects with required keys), and `bench.plain`, not
in the catalog. Every event's payload is the same 1 KB document, valid for the schema;
no destination, so each event is the accept path alone (decode, check, group commit).
The phases alternate, plain then schema, `--rounds` times, each `--duration` seconds of
POST /v1/events from `--connections` kept-alive connections (an asyncio client in its own
process). Each phase reports the ingress process's CPU (user + system, psutil) per
accepted event, after an unreported warm-up of both types; the summary gives the medians,
their spread (min, max), and the ratio of the medians.
Writes bench/reports/event-schema-cost-<time>.json and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import psutil

from bench.harness import stack
from bench.harness.report import REPORTS, save_json
from engine.testing.ingress_server import IngressProcess

PAYLOAD_BYTES = 1024
ROUTE = "/v1/events"
WARM_UP_S = 3.0


def schema_and_payload() -> tuple[dict[str, Any], dict[str, Any]]:
    """A 20-property schema and a payload of PAYLOAD_BYTES (as JSON) that passes it."""
    properties: dict[str, Any] = {}
    payload: dict[str, Any] = {}
    for i in range(20):
        kind = i % 4
        if kind == 0:
            properties[f"f{i}"] = {"type": "string", "maxLength": 100}
            payload[f"f{i}"] = "x" * 40
        elif kind == 1:
            properties[f"f{i}"] = {"type": "integer", "minimum": 0}
            payload[f"f{i}"] = 12345
        elif kind == 2:
            properties[f"f{i}"] = {"enum": ["free", "pro", "enterprise"]}
            payload[f"f{i}"] = "pro"
        else:
            properties[f"f{i}"] = {
                "type": "object", "required": ["id"],
                "properties": {"id": {"type": "string"}, "n": {"type": "number"}}}
            payload[f"f{i}"] = {"id": "abc" * 10, "n": 1.5}
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    # The padding: a free-form string property the schema allows (additionalProperties).
    payload["note"] = ""
    payload["note"] = "p" * (PAYLOAD_BYTES - len(json.dumps(payload, separators=(",", ":"))))
    return schema, payload


async def _drive(port: int, body: bytes, token: str, connections: int, seconds: float
                 ) -> dict[str, int]:
    request = (f"POST {ROUTE} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
               ).encode() + body
    counts = {"accepted": 0, "other": 0}
    deadline = time.monotonic() + seconds

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.monotonic() < deadline:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            counts["accepted" if head.startswith(b"HTTP/1.1 202") else "other"] += 1
        writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return counts


def client_main(argv: Sequence[str]) -> int:
    """The load generator's process: prints its counts as JSON."""
    port, token, connections, seconds = argv[0], argv[1], int(argv[2]), float(argv[3])
    body = sys.stdin.buffer.read()
    print(json.dumps(asyncio.run(_drive(int(port), body, token, connections, seconds))))
    return 0


def phase(ingress: IngressProcess, event_type: str, payload: dict[str, Any],
          connections: int, seconds: float) -> dict[str, Any]:
    assert ingress.proc is not None
    body = json.dumps({"type": event_type, "payload": payload}).encode()
    process = psutil.Process(ingress.proc.pid)
    before = process.cpu_times()
    started = time.monotonic()
    client = subprocess.run(
        [sys.executable, "-m", "bench.harness.event_schema_cost", "--client",
         str(ingress.port), ingress.token or "", str(connections), str(seconds)],
        input=body, capture_output=True, check=True)
    elapsed = time.monotonic() - started
    after = process.cpu_times()
    counts = json.loads(client.stdout)
    cpu_s = (after.user - before.user) + (after.system - before.system)
    accepted = counts["accepted"]
    return {"type": event_type, "accepted": accepted, "refused": counts["other"],
            "events_per_s": round(accepted / elapsed), "ingress_cpu_s": round(cpu_s, 3),
            "cpu_us_per_event": round(1e6 * cpu_s / max(accepted, 1), 1)}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--client"]:
        return client_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench event-schema-cost",
                                     description=__doc__.split("\n\n")[0])
    stack.add_server_arguments(parser)
    parser.add_argument("--duration", type=float, default=10, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=3, help="plain/schema pairs")
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args(argv)
    schema, payload = schema_and_payload()
    report: dict[str, Any] = {
        "bench": "event-schema-cost", "machine": stack.machine(),
        "payload_bytes": len(json.dumps(payload, separators=(",", ":"))),
        "schema_properties": len(schema["properties"]), "phases": []}
    token = "bench-event-schema-cost"
    with (stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin,
          stack.fresh_database(admin, "bench_event_schema") as dsn,
          IngressProcess(dsn, token=token) as ingress):
        created = ingress.request("POST", "/v1/event-types", {
            "name": "bench.schema", "schema": schema, "example": payload})
        assert created.status == 201, created
        time.sleep(1)  # the catalog is loaded (REFRESH_S) before the first phase
        # Unreported: the pool's connections, the first group commits, both types once.
        for event_type in ("bench.plain", "bench.schema"):
            phase(ingress, event_type, payload, args.connections, WARM_UP_S)
        for round_ in range(args.rounds):
            for event_type in ("bench.plain", "bench.schema"):
                result = phase(ingress, event_type, payload, args.connections, args.duration)
                result["round"] = round_ + 1
                report["phases"].append(result)
                print(result, flush=True)
    summary: dict[str, Any] = {}
    for event_type in ("bench.plain", "bench.schema"):
        costs = [p["cpu_us_per_event"] for p in report["phases"] if p["type"] == event_type]
        summary[event_type] = {"median_cpu_us_per_event": statistics.median(costs),
                               "min": min(costs), "max": max(costs)}
    summary["ratio_of_medians"] = round(
        summary["bench.schema"]["median_cpu_us_per_event"]
        / summary["bench.plain"]["median_cpu_us_per_event"], 3)
    report["summary"] = summary
    print(json.dumps(summary, indent=2))
    report["load_average_at_end"] = [round(x, 2) for x in psutil.getloadavg()]
    print("report:", save_json(REPORTS, "event-schema-cost", report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

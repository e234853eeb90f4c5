"""noisy-neighbour: does one tenant's backlog delay another tenant's deliveries?

    python -m bench noisy-neighbour [--backlog 200000] [--quick] [--repeat K] [--procs 2]
                                    [--b-rate 20] [--dsn URL | --stock-pg15]

Tenant A has --backlog due deliveries to an endpoint answering after 50 ms; tenant B posts
--b-rate events/s over HTTP, with its own key, to a fast endpoint on a server of its own
(another customer's: on A's server, B's requests queued at the receiver behind A's
thousand, which no sender can change). Both tenants, their keys and their destinations
are made through the engine's API (POST /v1/tenants, POST /v1/tenants/{uid}/keys, POST
/v1/destinations with the tenant's key); A's backlog is written in one statement
(sql/fill_tenant_backlog.sql, the rows ingress would write) and falls due at one moment a
few seconds later (sql/tenant_backlog_due.sql), once analyzed.

Each repeat runs two phases, each on a fresh database with a fresh `engine --procs N`
(warmed up first with --procs x --max-in-flight deliveries to A's host, as the drains do):
A alone, and A with B (alternating which comes first from one repeat to the next). B
starts a few seconds before A's backlog falls due and stops once A's last delivery
arrived. Accepted is when B's POST got its 202; delivered is when B's endpoint (the fake
destination, engine/testing/fakedest.mjs) received the event, by its clock (the same
machine's). B's latency is reported for the events accepted while A drained (from A's
backlog falling due to A's last arrival), and as references for those accepted before
A's backlog was written (B alone) and while it was written. A's rate is its deliveries
over the span from its first to its last arrival at its endpoint. The pass lines: B's p99
while A drains <= 250 ms, and A's rate with B >= 0.90 x alone (medians over the repeats).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import psycopg

from bench.harness import stack
from bench.harness.drain import enqueue_backlog
from bench.harness.report import REPORTS, save_json
from bench.harness.tenants import (
    Api,
    fill_backlog,
    median,
    percentiles,
    ratio,
    tenant_through_api,
)
from engine.config import Settings
from engine.testing.fakedest import FakeDestination

BENCH_DB = "engine_bench_noisy_neighbour"
BACKLOG = 200_000
QUICK_BACKLOG = 10_000
A_PATH, A_NAME = "slow/50/a", "a"  # A's endpoint answers after 50 ms
B_PATH, B_NAME = "fast/b", "b"
WARM_NAME = "warm-up"
B_RATE = 20.0  # events/s
# B alone before A's backlog is written, and A's backlog due this long after it is.
LEAD_S, QUICK_LEAD_S = 5.0, 2.0
DUE_DELAY_S, QUICK_DUE_DELAY_S = 5.0, 2.0
B_P99_LIMIT_MS = 250.0
A_RATIO_FLOOR = 0.90
WARM_UP_TIMEOUT_S = 120.0
B_SETTLE_TIMEOUT_S = 120.0  # for B's last events after A's drain
QUEUE_SETTLE_S = 30.0
B_BODY = b'{"type": "order.created", "payload": {"order": %d, "note": "tenant b"}}'


class Accepted(NamedTuple):
    """One of B's events: its id, when its POST was sent and when its 202 came back
    (unix ms)."""

    event_id: int
    sent_ms: float
    accepted_ms: float


class Sender:
    """Tenant B's traffic on a thread: POST /v1/events with B's key at `rate` events/s on
    one keep-alive connection, each on its schedule (or at once when behind)."""

    def __init__(self, base_url: str, key: str, rate: float) -> None:
        where = urlsplit(base_url)
        self.host, self.port = where.hostname or "127.0.0.1", where.port or 80
        self.headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
        self.rate = rate
        self.accepted: list[Accepted] = []
        self.refused: dict[str, int] = {}  # an answer other than 202, or an error, by kind
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sender:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        started = time.monotonic()
        sent = 0
        while not self._stop.wait(max(0.0, started + sent / self.rate - time.monotonic())):
            body = B_BODY % sent
            sent += 1
            sent_ms = time.time() * 1000
            try:
                conn.request("POST", "/v1/events", body, self.headers)
                response = conn.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                kind = type(exc).__name__
                self.refused[kind] = self.refused.get(kind, 0) + 1
                continue
            accepted_ms = time.time() * 1000
            if response.status == 202:
                self.accepted.append(Accepted(int(json.loads(answer)["id"]), sent_ms,
                                              accepted_ms))
            else:
                kind = str(response.status)
                self.refused[kind] = self.refused.get(kind, 0) + 1
        conn.close()


class Windows(NamedTuple):
    """The moments (unix ms) that part B's events by when they were accepted: A's backlog
    began to be written, fell due, and its last delivery arrived."""

    fill_ms: float
    due_ms: float
    drained_ms: float


def b_latencies(accepted: Sequence[Accepted], arrivals: dict[str, int], windows: Windows,
                started: dict[str, float]) -> dict[str, Any]:
    """B's accept-to-delivered latency (ms) of the events accepted while B was alone
    (before A's backlog was written), while it was written and analyzed (the engine idle,
    PostgreSQL busy), and while A drained (from its backlog falling due to its last
    arrival; those after it are left out), with the 202's own latency, and the accepted
    events that never arrived. Those while A drains are split in two by when the worker
    began the request that arrived (`started`: webhook-id -> unix ms, the worker's clock):
    waiting in the engine, and the request's way to the receiver."""
    found: dict[str, list[float]] = {"alone": [], "written": [], "drains": []}
    in_engine: list[float] = []
    on_the_way: list[float] = []
    missing = 0
    for event in accepted:
        arrived = arrivals.get(f"evt_{event.event_id}")
        if arrived is None:
            missing += 1
            continue
        if event.accepted_ms < windows.fill_ms:
            window = "alone"
        elif event.accepted_ms < windows.due_ms:
            window = "written"
        elif event.accepted_ms <= windows.drained_ms:
            window = "drains"
        else:
            continue
        found[window].append(round(arrived - event.accepted_ms, 1))
        began = started.get(f"evt_{event.event_id}")
        if window == "drains" and began is not None:
            in_engine.append(round(began - event.accepted_ms, 1))
            on_the_way.append(round(arrived - began, 1))
    return {
        "accepted": len(accepted),
        "never_delivered": missing,
        "accept_ms": percentiles([round(e.accepted_ms - e.sent_ms, 1) for e in accepted]),
        "latency_ms_while_a_drains": {"events": len(found["drains"]),
                                      **percentiles(found["drains"])},
        "while_a_drains_accepted_to_request_ms": percentiles(in_engine),
        "while_a_drains_request_to_arrival_ms": percentiles(on_the_way),
        "latency_ms_b_alone": {"events": len(found["alone"]), **percentiles(found["alone"])},
        "latency_ms_while_a_backlog_written": {"events": len(found["written"]),
                                               **percentiles(found["written"])},
    }


def wait_drained(dest: FakeDestination, name: str, count: int, engine: stack.Engine,
                 label: str, timeout_s: float) -> dict[str, Any]:
    """Until `name` has `count` distinct deliveries at the fake destination; its counters."""
    deadline = time.monotonic() + timeout_s
    shown = time.monotonic()
    while True:
        stats = dest.name_stats(name)
        delivered = int(stats.get("delivered_ids", 0))
        if delivered >= count:
            return stats
        if not engine.alive():
            raise stack.BenchError(f"{label}: the engine exited during the drain")
        if time.monotonic() > deadline:
            raise stack.BenchError(f"{label}: {delivered} of {count} delivered to {name} in"
                                   f" {timeout_s:.0f} s")
        if time.monotonic() - shown >= 5:
            print(f"noisy-neighbour: {label}: {delivered:,} of {count:,}", file=sys.stderr,
                  flush=True)
            shown = time.monotonic()
        time.sleep(0.2)


def request_starts(conn: psycopg.Connection, destination_id: int) -> dict[str, float]:
    """webhook-id -> unix ms at which a worker began the last request to the destination
    (delivery_attempts.started_at), once the engine has recorded them."""
    queue_settled(conn)
    rows = conn.execute(
        "SELECT f.event_id, max(extract(epoch FROM a.started_at) * 1000)"
        " FROM finished_deliveries f JOIN delivery_attempts a ON a.delivery_id = f.id"
        " WHERE f.destination_id = %s GROUP BY f.event_id", (destination_id,)).fetchall()
    return {f"evt_{event_id}": float(ms) for event_id, ms in rows}


def queue_settled(conn: psycopg.Connection) -> int:
    """Deliveries still in the queue once the engine has written the results of what it
    sent (the destination counts a delivery when it arrives, the engine a moment later),
    waiting up to QUEUE_SETTLE_S for none."""
    deadline = time.monotonic() + QUEUE_SETTLE_S
    while True:
        row = conn.execute("SELECT count(*) FROM deliveries").fetchone()
        left = int(row[0]) if row else 0
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def run_phase(admin_dsn: str, args: argparse.Namespace, with_b: bool) -> dict[str, Any]:
    """A's backlog drained by a fresh engine, with B's traffic or without."""
    label = "A with B" if with_b else "A alone"
    lead_s = QUICK_LEAD_S if args.quick else LEAD_S
    due_delay_s = QUICK_DUE_DELAY_S if args.quick else DUE_DELAY_S
    warm = args.procs * args.max_in_flight
    with (
        stack.fresh_database(admin_dsn, BENCH_DB) as dsn,
        FakeDestination(extra_args=["--keep", "0"]) as dest,
        FakeDestination(extra_args=["--keep", "0"]) as dest_b,
        psycopg.connect(dsn, autocommit=True) as conn,
        stack.Engine(dsn, args.procs, ["--max-in-flight", str(args.max_in_flight)]) as engine,
    ):
        settings = stack.server_report(conn)
        pg_pid = stack.postmaster_pid(conn)
        # The engine's connections to the host open before the backlog, as a running
        # engine's are (a default-tenant destination beside A's endpoint).
        enqueue_backlog(dsn, stack.add_destination(conn, dest.url(f"slow/50/{WARM_NAME}")),
                        warm)
        dest.wait_for(WARM_NAME, "delivered_ids", warm, WARM_UP_TIMEOUT_S)
        api = Api(engine.base_url)
        tenant_a = tenant_through_api(api, "tenant-a", dest.url(A_PATH))
        tenant_b = tenant_through_api(api, "tenant-b", dest_b.url(B_PATH))
        load_before = os.getloadavg()
        sender = Sender(engine.base_url, tenant_b.key, args.b_rate) if with_b else None
        with sender or contextlib.nullcontext():
            if sender is not None:
                time.sleep(lead_s)
            fill_started = time.monotonic()
            fill_ms = time.time() * 1000
            due_ms = fill_backlog(conn, [tenant_a.destination_id], [tenant_a.id],
                                  args.backlog, due_delay_s)
            conn.execute("VACUUM ANALYZE deliveries, events")
            fill_s = time.monotonic() - fill_started
            time.sleep(max(0.0, due_ms / 1000 - time.time()))
            cpu = stack.CpuMeter({"engine": [engine.pid], "postgres": [pg_pid]})
            a_stats = wait_drained(dest, A_NAME, args.backlog, engine, label,
                                   max(120.0, args.backlog / 500))
            cpu_s = cpu.take()
        b_report = None
        if sender is not None:
            dest_b.wait_for(B_NAME, "delivered_ids", len(sender.accepted), B_SETTLE_TIMEOUT_S)
            b_report = {
                "sent": len(sender.accepted) + sum(sender.refused.values()),
                "refused": sender.refused,
                "duplicates": dest_b.name_stats(B_NAME).get("duplicates"),
                **b_latencies(sender.accepted, dest_b.arrivals(B_NAME), Windows(
                    fill_ms, due_ms, int(a_stats["last_request_ms"])),
                    request_starts(conn, tenant_b.destination_id)),
            }
        left = queue_settled(conn)
        recorded = conn.execute(
            "SELECT count(*) FROM finished_deliveries WHERE status = 'delivered'"
            " AND destination_id = %s", (tenant_a.destination_id,)).fetchone()
    a_delivered = int(a_stats["delivered_ids"])
    span_s = (int(a_stats["last_request_ms"]) - int(a_stats["first_request_ms"])) / 1000
    return {
        "phase": label,
        "backlog": args.backlog,
        "a_delivered": a_delivered,
        "a_duplicates": a_stats.get("duplicates"),
        "a_span_s": round(span_s, 3),
        "a_deliveries_per_s": round(a_delivered / span_s, 1) if span_s > 0 else None,
        "a_first_arrival_after_due_ms": int(a_stats["first_request_ms"]) - due_ms,
        "a_max_in_flight_at_destination": a_stats.get("max_concurrent"),
        "b": b_report,
        "fill_and_analyze_s": round(fill_s, 2),
        "a_recorded_delivered": recorded[0] if recorded else None,
        "left_in_queue": left,
        "cpu_s": cpu_s,
        "cpu_us_per_a_delivery": {part: round(seconds * 1e6 / max(a_delivered, 1), 1)
                                  for part, seconds in cpu_s.items()},
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "postgres": settings,
        "engine_command": engine.command,
        "engine_warm_up_deliveries": warm,
    }


def pair(alone: dict[str, Any], with_b: dict[str, Any]) -> dict[str, Any]:
    """One repeat: A's rate with B over alone, and B's latency while A drained."""
    during = with_b["b"]["latency_ms_while_a_drains"]
    return {
        "a_alone_per_s": alone["a_deliveries_per_s"],
        "a_with_b_per_s": with_b["a_deliveries_per_s"],
        "a_ratio": ratio(with_b["a_deliveries_per_s"], alone["a_deliveries_per_s"]),
        "b_events_while_a_drains": during["events"],
        **{f"b_{key}_ms": during[key] for key in ("p50", "p95", "p99", "max")},
    }


def verdict(pairs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The medians over the repeats and the two pass lines."""
    medians = {key: median([p[key] for p in pairs]) for key in pairs[0]}
    b_p99, a_ratio = medians["b_p99_ms"], medians["a_ratio"]
    b_pass = b_p99 is not None and b_p99 <= B_P99_LIMIT_MS
    a_pass = a_ratio is not None and a_ratio >= A_RATIO_FLOOR
    return {
        "repeats": len(pairs),
        "median": medians,
        "b_p99_pass": b_pass,
        "a_ratio_pass": a_pass,
        "lines": [
            f"B accept-to-delivered p99 while A drains: {b_p99} ms (limit {B_P99_LIMIT_MS:g}"
            f" ms): {'PASS' if b_pass else 'FAIL'}",
            f"A's drain with B / alone: {a_ratio} (floor {A_RATIO_FLOOR:.2f}):"
            f" {'PASS' if a_pass else 'FAIL'}",
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench noisy-neighbour",
                                     description=__doc__.split("\n\n")[0])
    stack.add_server_arguments(parser)
    parser.add_argument("--backlog", type=int,
                        help=f"tenant A's due deliveries (default {BACKLOG:,};"
                             f" --quick: {QUICK_BACKLOG:,})")
    parser.add_argument("--quick", action="store_true",
                        help="a small backlog and short lead times: a smoke run")
    parser.add_argument("--repeat", type=int, default=1,
                        help="pairs of phases (A alone, A with B), then each one's median")
    parser.add_argument("--procs", type=int, default=2, help="engine delivery workers")
    parser.add_argument("--max-in-flight", type=int, default=Settings().max_in_flight,
                        help="the engine's requests in flight per worker")
    parser.add_argument("--b-rate", type=float, default=B_RATE,
                        help="tenant B's events/s (default %(default)s)")
    parser.add_argument("--reports", type=Path, default=REPORTS,
                        help="folder for the JSON report")
    args = parser.parse_args(argv)
    if args.backlog is None:
        args.backlog = QUICK_BACKLOG if args.quick else BACKLOG
    if args.backlog < 1 or args.repeat < 1 or args.procs < 1 or args.b_rate <= 0:
        parser.error("--backlog, --repeat, --procs and --b-rate must be positive")

    phases: list[dict[str, Any]] = []
    pairs = []
    try:
        with stack.server(args.dsn, stock_pg15_cluster=args.stock_pg15) as admin_dsn:
            for k in range(args.repeat):
                # Alternating which phase runs first, so drift over the run skews neither.
                order = (False, True) if k % 2 == 0 else (True, False)
                ran = {with_b: run_phase(admin_dsn, args, with_b) for with_b in order}
                phases += [ran[with_b] for with_b in order]
                pairs.append(pair(ran[False], ran[True]))
                print(f"noisy-neighbour: repeat {k + 1}: {json.dumps(pairs[-1])}",
                      file=sys.stderr, flush=True)
    except stack.BenchError as exc:
        print(f"noisy-neighbour: {exc}", file=sys.stderr)
        return 1
    report = {
        "scenario": "noisy-neighbour",
        "options": {"backlog": args.backlog, "quick": args.quick, "repeat": args.repeat,
                    "procs": args.procs, "max_in_flight": args.max_in_flight,
                    "b_rate": args.b_rate, "stock_pg15": args.stock_pg15,
                    "external_dsn": bool(args.dsn)},
        "git_commit": stack.git_commit(),
        "machine": stack.machine(),
        "phases": phases,
        "pairs": pairs,
        **verdict(pairs),
    }
    path = save_json(args.reports, "noisy-neighbour", report)
    print(json.dumps(report, indent=2), flush=True)
    for line in report["lines"]:
        print(line, flush=True)
    print(f"report: {path}", flush=True)
    return 0

"""throughput: locust (headless, FastHttpUser) posts events at a fixed rate in steps while
the engine delivers each to 2 fake destinations. Per step: accepted/s, delivered/s, backlog
growth, accept latency p50/p99 (locust's and the server's own histogram), end-to-end
latency (event commit -> arrival at the destination, the fake's clock), CPU split engine /
PostgreSQL / destination / locust. The sustainable rate is the highest step whose backlog
stayed flat and whose accept p99 stayed under 10 ms."""

from __future__ import annotations

import csv
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import stack
from bench.harness.live import Live
from bench.harness.report import Report, figure, figure_rows
from engine.testing.fakedest import FakeDestination

QUICK_STEPS = (250, 500, 1000)
# The lowest step is where the 2-core development VM met the 10 ms accept bound
# (bench/results/2026-12-02-run-all.md), so the full run can name a sustainable rate there.
FULL_STEPS = (250, 500, 1000, 2000, 4000)
QUICK_STEP_S = 14
FULL_STEP_S = 30
ACCEPT_P99_LIMIT_MS = 10.0
# Flat: the backlog grew by less than this share of what the step posted.
FLAT_SHARE = 0.05
LOCUSTFILE = Path(__file__).with_name("locustfile.py")
SQL = Path(__file__).with_name("sql")
BACKLOG = (SQL / "backlog.sql").read_text()
EVENT_TIMES = (SQL / "event_times.sql").read_text()


def users_for(rate: int) -> int:
    # Each user paces itself; 40 events/s per user keeps each connection mostly idle.
    return max(10, rate // 40)


def locust(base_url: str, rate: int, seconds: int, folder: str) -> subprocess.Popen[bytes]:
    users = users_for(rate)
    env = {**os.environ, "BENCH_MODE": "single", "BENCH_USER_RPS": str(rate / users)}
    return subprocess.Popen(
        ["locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users), "-r", str(users),
         "-t", f"{seconds}s", "-H", base_url, "--csv", f"{folder}/step", "--only-summary",
         "--stop-timeout", "5", "--loglevel", "WARNING"],
        env=env, cwd=stack.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def locust_stats(folder: str) -> dict[str, Any]:
    try:
        with open(f"{folder}/step_stats.csv") as stats:
            rows = {row["Name"]: row for row in csv.DictReader(stats)}
    except OSError:
        raise stack.BenchError("locust wrote no statistics (run `locust -V` to check it)"
                               ) from None
    total = rows["Aggregated"]
    return {"requests": int(total["Request Count"]), "failures": int(total["Failure Count"]),
            "p50_ms": float(total["50%"]), "p99_ms": float(total["99%"])}


def quantiles_ms(values: list[float]) -> dict[str, float | None]:
    values = sorted(values)

    def at(q: float) -> float | None:
        return round(values[min(len(values) - 1, int(q * len(values)))], 1) if values else None

    return {"p50": at(0.5), "p99": at(0.99)}


def run(admin_dsn: str, args: Any, report: Report, live: Live) -> None:
    steps = QUICK_STEPS if args.quick else FULL_STEPS
    seconds = QUICK_STEP_S if args.quick else FULL_STEP_S
    report.data["settings"] = {"steps_events_per_s": steps, "step_s": seconds,
                               "destinations_per_event": 2, "engine_procs": args.procs,
                               "accept_p99_limit_ms": ACCEPT_P99_LIMIT_MS,
                               "flat_backlog_share": FLAT_SHARE}
    results: list[dict[str, Any]] = []
    timeline: list[dict[str, Any]] = []
    with (stack.fresh_database(admin_dsn, "engine_bench_throughput") as dsn,
          FakeDestination(secrets=[stack.SECRET], extra_args=["--keep", "0"]) as dest,
          psycopg.connect(dsn, autocommit=True) as conn):
        report.data["postgres"] = stack.pg_settings(dsn)
        for name in ("a", "b"):
            stack.add_destination(conn, dest.url(f"fast/{name}"))
        live.phase("starting the engine")
        with stack.Engine(dsn, args.procs) as engine:
            report.data["engine_command"] = engine.command
            cpu = stack.CpuMeter({"engine": [engine.pid], "postgres": [stack.postmaster_pid(conn)],
                                  "destination": [dest.pid]})
            began = time.monotonic()
            for rate in steps:
                live.phase(f"{rate:,} events/s")
                step = run_step(conn, dest, engine, cpu, rate, seconds, live, timeline, began)
                results.append(step)
                # A saturated engine only gets slower at higher steps; --quick is short
                # enough to take every step (a loaded machine may not reach any rate).
                if not args.quick and step["accepted_per_s"] < 0.5 * rate:
                    live.log(f"stopping after {rate:,}/s: under half of it was accepted")
                    break
        report.data["destination"] = stack.destination_totals(dest)
    report.data["steps"] = results
    report.data["timeline"] = timeline
    write(report, results, timeline)


def run_step(conn: psycopg.Connection, dest: FakeDestination, engine: stack.Engine,
             cpu: stack.CpuMeter, rate: int, seconds: int, live: Live,
             timeline: list[dict[str, Any]], began: float) -> dict[str, Any]:
    """One step. Its window opens when locust's first event is in the database (locust
    takes seconds to start on a loaded machine) and closes when locust exits."""
    _, last_id0 = stack.run_sql(conn, BACKLOG)[0]
    with tempfile.TemporaryDirectory(prefix="engine-locust-") as folder:
        proc = locust(engine.base_url, rate, seconds, folder)
        cpu.add("locust", [proc.pid])
        opened: dict[str, Any] | None = None
        deadline = time.monotonic() + seconds + 90
        while proc.poll() is None:
            time.sleep(1.0 if opened else 0.2)
            cpu.poll()
            backlog, last_id = stack.run_sql(conn, BACKLOG)[0]
            delivered = dest.stats()["totals"]["delivered_ids"]
            if opened is None and last_id > last_id0:
                opened = {"at": time.monotonic(), "backlog": backlog, "delivered": delivered,
                          "server": stack.histogram(engine.metrics_text(),
                                                    "engine_ingress_request_seconds",
                                                    'route="create_event"')}
                cpu.take()
            timeline.append({"t": round(time.monotonic() - began, 1), "rate": rate,
                             "backlog": backlog, "delivered": delivered, "events": last_id})
            live.figures(f"{rate:,}/s: backlog {backlog:,}, delivered {delivered:,}")
            if time.monotonic() > deadline:
                proc.kill()
                raise stack.BenchError("locust did not stop after its step")
        used = cpu.take()
        stats = locust_stats(folder)
    if opened is None:
        raise stack.BenchError(f"locust posted no event at {rate}/s (is ingress answering?)")
    elapsed = time.monotonic() - opened["at"]
    backlog1, last_id1 = stack.run_sql(conn, BACKLOG)[0]
    delivered1 = dest.stats()["totals"]["delivered_ids"]
    server = stack.histogram_quantiles_ms(opened["server"], stack.histogram(
        engine.metrics_text(), "engine_ingress_request_seconds", 'route="create_event"'))
    committed = dict(stack.run_sql(conn, EVENT_TIMES, (last_id0, last_id1)))
    end_to_end = []
    for name in ("a", "b"):
        for webhook_id, arrived in dest.arrivals(name).items():
            at = committed.get(int(webhook_id.removeprefix("evt_")))
            if at is not None:
                end_to_end.append(float(arrived - at))
    accepted = last_id1 - last_id0
    growth = backlog1 - opened["backlog"]
    return {
        "target_per_s": rate, "seconds": round(elapsed, 1), "users": users_for(rate),
        "accepted_per_s": round(accepted / elapsed), "failed": stats["failures"],
        "delivered_per_s": round((delivered1 - opened["delivered"]) / elapsed),
        "backlog_start": opened["backlog"], "backlog_end": backlog1,
        "backlog_growth_per_s": round(growth / elapsed, 1),
        "backlog_flat": growth <= FLAT_SHARE * 2 * accepted,
        "accept_p50_ms": stats["p50_ms"], "accept_p99_ms": stats["p99_ms"],
        "server_p50_le_ms": server["p50_le_ms"], "server_p99_le_ms": server["p99_le_ms"],
        "end_to_end_ms": quantiles_ms(end_to_end), "end_to_end_samples": len(end_to_end),
        "cpu_s": used,
        "cpu_share": {k: round(v / elapsed, 2) for k, v in used.items()},
    }


def write(report: Report, steps: list[dict[str, Any]], timeline: list[dict[str, Any]]) -> None:
    ok = [s for s in steps if s["backlog_flat"] and s["accept_p99_ms"] < ACCEPT_P99_LIMIT_MS]
    sustainable = max((s["target_per_s"] for s in ok), default=None)
    report.data["sustainable_events_per_s"] = sustainable
    report.headline.append(
        f"sustainable: {sustainable:,} events/s x 2 destinations (flat backlog, accept p99 "
        f"< {ACCEPT_P99_LIMIT_MS:g} ms)" if sustainable else
        f"no step was sustainable (flat backlog and accept p99 < {ACCEPT_P99_LIMIT_MS:g} ms)")
    for s in steps:
        report.headline.append(
            f"{s['target_per_s']:,}/s: accepted {s['accepted_per_s']:,}/s, delivered "
            f"{s['delivered_per_s']:,}/s, accept p99 {s['accept_p99_ms']:g} ms, end-to-end "
            f"p99 {s['end_to_end_ms']['p99']} ms")
    report.section("Steps", "Accepted and delivered per second over each step; the backlog "
                   "is what is pending or in flight; accept latency from locust and from the "
                   "server's own histogram (bucket bounds); end-to-end from the event's "
                   "commit to its arrival at the fake destination. CPU in cores (CPU s / s).")
    report.table(
        ["target/s", "accepted/s", "delivered/s", "backlog growth/s", "flat", "accept p50/p99 ms",
         "server p50/p99 ms (<=)", "end-to-end p50/p99 ms", "CPU engine/PG/dest/locust"],
        [[s["target_per_s"], s["accepted_per_s"], s["delivered_per_s"],
          s["backlog_growth_per_s"], "yes" if s["backlog_flat"] else "no",
          f"{s['accept_p50_ms']:g} / {s['accept_p99_ms']:g}",
          f"{s['server_p50_le_ms']} / {s['server_p99_le_ms']}",
          f"{s['end_to_end_ms']['p50']} / {s['end_to_end_ms']['p99']}",
          " / ".join(f"{s['cpu_share'].get(k, 0):.2f}" for k in
                     ("engine", "postgres", "destination", "locust"))]
         for s in steps])
    plots(report, steps, timeline)


def plots(report: Report, steps: list[dict[str, Any]], timeline: list[dict[str, Any]]) -> None:
    fig, axes = figure_rows("Throughput over time (each event to 2 destinations)", 2)
    t = [p["t"] for p in timeline]
    delivered = [p["delivered"] for p in timeline]
    rates = [0.0] + [(b - a) / max(tb - ta, 1e-9) for a, b, ta, tb in
                     zip(delivered, delivered[1:], t, t[1:], strict=False)]
    axes[0].plot(t, [2 * p["rate"] for p in timeline], label="offered deliveries/s (2 x step)",
                 drawstyle="steps-post", color="grey", linestyle="--")
    events = [p["events"] for p in timeline]
    accepted = [0.0] + [2 * (b - a) / max(tb - ta, 1e-9) for a, b, ta, tb in
                        zip(events, events[1:], t, t[1:], strict=False)]
    axes[0].plot(t, accepted, label="accepted events/s x 2 (ingress)")
    axes[0].plot(t, rates, label="delivered/s (fake destination)")
    axes[0].set_ylabel("deliveries/s")
    axes[1].plot(t, [p["backlog"] for p in timeline], color="tab:red")
    axes[1].set_ylabel("backlog (deliveries)")
    axes[1].set_xlabel("seconds since the first step")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
    axes[0].legend()
    report.plot(fig, "throughput_timeline.png", "Delivered/s and backlog over time")

    fig, ax = figure("Latency by step")
    x = [str(s["target_per_s"]) for s in steps]
    ax.plot(x, [s["accept_p99_ms"] for s in steps], marker="o", label="accept p99 (locust)")
    ax.plot(x, [s["server_p99_le_ms"] or 0 for s in steps], marker="o",
            label="accept p99 (server, bucket bound)")
    ax.plot(x, [s["end_to_end_ms"]["p50"] or 0 for s in steps], marker="s",
            label="end-to-end p50")
    ax.plot(x, [s["end_to_end_ms"]["p99"] or 0 for s in steps], marker="s",
            label="end-to-end p99")
    ax.axhline(ACCEPT_P99_LIMIT_MS, color="grey", linestyle=":", label="10 ms accept limit")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("offered events/s")
    ax.set_ylabel("ms (log scale above 10)")
    ax.legend(fontsize=8)
    report.plot(fig, "throughput_latency.png", "Accept and end-to-end latency per step")

    fig, ax = figure("CPU by part per step")
    bottom = [0.0] * len(steps)
    for part in ("engine", "postgres", "destination", "locust"):
        values = [s["cpu_share"].get(part, 0.0) for s in steps]
        ax.bar(x, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xlabel("offered events/s")
    ax.set_ylabel("cores busy (CPU s per s)")
    ax.set_ylim(bottom=0)
    ax.legend()
    report.plot(fig, "throughput_cpu.png", "CPU split per step")

"""slow-destination and dead-destination: does a bad endpoint slow the healthy ones down?
Continuous traffic (a loader enqueuing at a fixed rate, as ingress would) to a healthy
endpoint answering after 50 ms, first alone (the baseline), then in the same run beside
bad endpoints taking a share of the traffic:

- slow-destination: one endpoint answering after 5 s; then 20 endpoints at 1 s each.
- dead-destination: one endpoint that never answers (10 s timeout); then 50 of them with
  continuous traffic, outnumbering the engine's request slots (--max-in-flight 32 per
  worker).

Per phase (a fresh database and engine each): healthy deliveries/s, the ratio to the
baseline, the longest gap between two healthy arrivals, healthy end-to-end p50/p99 and
what the bad endpoints held at once."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import stack
from bench.harness.live import Live
from bench.harness.report import Report, figure
from engine.testing.fakedest import FakeDestination

HEALTHY = "slow/50/healthy"
HEALTHY_NAME = "healthy"
MAX_IN_FLIGHT = 32
HEALTHY_RATE = 200.0  # events/s to the healthy endpoint
BAD_SHARE = 0.25  # extra events to the bad endpoints, as a share of the healthy rate
PAYLOAD = '{"order": 42, "note": "' + "x" * 200 + '"}'
SQL = Path(__file__).with_name("sql")
EVENT_TIMES = (SQL / "event_times.sql").read_text()


@dataclass(frozen=True)
class Phase:
    name: str
    bad_path: str | None  # fakedest path with {i} for the endpoint's number
    bad_count: int
    bad_timeout_ms: int


PHASES = {
    "slow": (Phase("baseline", None, 0, 0),
             Phase("one 5 s endpoint", "slow/5000/slow-{i}", 1, 10_000),
             Phase("20 endpoints at 1 s", "slow/1000/slow-{i}", 20, 10_000)),
    "dead": (Phase("baseline", None, 0, 0),
             Phase("one dead endpoint", "dead/dead-{i}", 1, 10_000),
             Phase("50 dead endpoints", "dead/dead-{i}", 50, 10_000)),
}


def run(admin_dsn: str, args: Any, report: Report, live: Live) -> None:
    phase_s = 14.0 if args.quick else 30.0
    phases = PHASES[args.variant]
    report.data["settings"] = {
        "phase_s": phase_s, "healthy_events_per_s": HEALTHY_RATE, "bad_share": BAD_SHARE,
        "healthy_path": HEALTHY, "max_in_flight_per_worker": MAX_IN_FLIGHT,
        "engine_procs": args.procs, "phases": [p.__dict__ for p in phases]}
    results = []
    with FakeDestination(secrets=[stack.SECRET], extra_args=["--keep", "0"]) as dest:
        for phase in phases:
            live.phase(phase.name)
            results.append(run_phase(admin_dsn, args, dest, phase, phase_s, live, report))
            dest.reset()
    base = results[0]["healthy_per_s"] or 1
    for r in results:
        r["ratio_to_baseline"] = round(r["healthy_per_s"] / base, 3)
    report.data["phases"] = results
    write(report, results)


def run_phase(admin_dsn: str, args: Any, dest: FakeDestination, phase: Phase, seconds: float,
              live: Live, report: Report) -> dict[str, Any]:
    with (stack.fresh_database(admin_dsn, "engine_bench_destinations") as dsn,
          psycopg.connect(dsn, autocommit=True) as conn):
        report.data.setdefault("postgres", stack.pg_settings(dsn))
        healthy = stack.add_destination(conn, dest.url(HEALTHY))
        bad = [stack.add_destination(conn, dest.url(phase.bad_path.format(i=i)),
                                     phase.bad_timeout_ms)
               for i in range(phase.bad_count)] if phase.bad_path else []
        bad_cycle = itertools.cycle(bad)
        every = round(1 / BAD_SHARE)

        def route(index: int) -> list[int]:
            # Every `every`-th event also goes to the next bad endpoint, round robin.
            return [healthy, next(bad_cycle)] if bad and index % every == 0 else [healthy]

        with stack.Engine(dsn, args.procs, ["--max-in-flight", str(MAX_IN_FLIGHT)]) as engine:
            cpu = stack.CpuMeter({"engine": [engine.pid], "destination": [dest.pid]})
            with stack.Loader(dsn, HEALTHY_RATE, route, PAYLOAD):
                started = time.monotonic()
                while (elapsed := time.monotonic() - started) < seconds:
                    time.sleep(1.0)
                    got = dest.name_stats(HEALTHY_NAME).get("delivered_ids", 0)
                    live.figures(f"{phase.name}: healthy {got / max(elapsed, 1):,.0f}/s")
            used = cpu.take()
            stats = dest.stats()["names"]
        arrivals = dest.arrivals(HEALTHY_NAME)
        committed = dict(stack.run_sql(conn, EVENT_TIMES, (0, 2**62)))
    times = sorted(arrivals.values())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    latency = sorted(float(ms - committed[int(i.removeprefix("evt_"))])
                     for i, ms in arrivals.items() if int(i.removeprefix("evt_")) in committed)
    bad_stats = [s for n, s in stats.items() if n != HEALTHY_NAME]
    return {
        "phase": phase.name, "seconds": seconds,
        "healthy_delivered": len(times),
        "healthy_per_s": round(len(times) / seconds, 1),
        "healthy_longest_gap_ms": max(gaps, default=None),
        "healthy_end_to_end_p50_ms": _q(latency, 0.5),
        "healthy_end_to_end_p99_ms": _q(latency, 0.99),
        "bad_endpoints": phase.bad_count,
        "bad_requests": sum(s["requests"] for s in bad_stats),
        "bad_max_concurrent": sum(s["max_concurrent"] for s in bad_stats),
        "duplicates": stats.get(HEALTHY_NAME, {}).get("duplicates"),
        "sig_bad": stats.get(HEALTHY_NAME, {}).get("sig_bad"),
        "cpu_s": used,
    }


def _q(values: list[float], q: float) -> float | None:
    return round(values[min(len(values) - 1, int(q * len(values)))], 1) if values else None


def write(report: Report, results: list[dict[str, Any]]) -> None:
    for r in results[1:]:
        report.headline.append(
            f"{r['phase']}: healthy {r['healthy_per_s']:,.0f}/s = {r['ratio_to_baseline']:.2f}"
            f" x baseline ({results[0]['healthy_per_s']:,.0f}/s), longest healthy gap "
            f"{r['healthy_longest_gap_ms']} ms, healthy end-to-end p99 "
            f"{r['healthy_end_to_end_p99_ms']} ms")
    report.section("Phases", "Each phase: a fresh database and engine, the same healthy "
                   f"traffic ({HEALTHY_RATE:.0f} events/s to an endpoint answering after "
                   f"50 ms), plus {BAD_SHARE:.0%} more to the bad endpoints. The healthy rate "
                   "is bounded by what is offered: a ratio of 1.0 means no harm.")
    report.table(
        ["phase", "healthy/s", "x baseline", "longest healthy gap ms", "healthy e2e p50/p99 ms",
         "bad endpoints", "bad requests", "bad held at once", "duplicates"],
        [[r["phase"], r["healthy_per_s"], r["ratio_to_baseline"], r["healthy_longest_gap_ms"],
          f"{r['healthy_end_to_end_p50_ms']} / {r['healthy_end_to_end_p99_ms']}",
          r["bad_endpoints"], r["bad_requests"], r["bad_max_concurrent"], r["duplicates"]]
         for r in results])
    fig, axes = figure("Healthy deliveries/s beside bad endpoints", size=(8, 4))
    names = [r["phase"] for r in results]
    axes.bar(names, [r["healthy_per_s"] for r in results], color="tab:green")
    axes.axhline(HEALTHY_RATE, color="grey", linestyle="--", label="offered (healthy)")
    for i, r in enumerate(results):
        axes.text(i, r["healthy_per_s"], f"{r['ratio_to_baseline']:.2f}x",
                  ha="center", va="bottom")
    axes.set_ylim(0, HEALTHY_RATE * 1.2)
    axes.set_ylabel("healthy deliveries/s")
    axes.legend(loc="upper right")
    report.plot(fig, f"{report.data['scenario']}_healthy.png", "Healthy throughput per phase")

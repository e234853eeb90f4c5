"""bloat --history partitions|deletes|both: the bloat soak with history passing retention,
removed by dropping day partitions (this checkout, schema/026) or by today's-before-
partitions batch deletes (the engine from before partitions, main's last commit before
schema/025, unpacked with `git archive`), side by side with `both`.

    python -m bench bloat --history both [--duration 300] [--history-day-s 30]
                          [--dsn URL | --stock-pg15]

Each variant has its own database and its own `engine --procs 1` on one server, at the same
time (they share the machine and its load), under bloat's soak: events enqueued as ingress
does at a fixed rate (40/s, --quick 30/s: below bloat's own, so that both engines keep up),
each to 2 of 4 destinations failing 40 % of attempts, retried after 1, 2, 4, 8 s. Days
pass on a compressed clock: one day every --history-day-s seconds (30).
Before the soak each database gets the history a running engine would have: days =
soak / day + 2 days of delivered events (rate x day-s a day: what the soak inserts while a
day passes, so removal keeps pace with inserts as it does past a production database's first
retention period), each with its finished deliveries and their attempts, then VACUUM
ANALYZE. The partitioned database's dated partitions are laid out day by day over those
days (history_relayout.sql: a fresh database's legacy partition would hold them all). The
engines' own retention is set to 3,650 days (it removes nothing); a driver
(retention_driver.py) runs each engine's own history job every 5 s with retention_days
falling by one per day-s: the partition job drops the day partitions past the cutoff, the
old retention deletes the rows past it, 1,000 a transaction. So both remove the same rows
at the same pace, one by DROP and one by DELETE; the drops are as many times more frequent
than in production as the clock is compressed (2,880 x at 30 s a day), so what they cost
the claim (an ACCESS EXCLUSIVE on the parent for an instant) is exaggerated by as much.

Sampled every 5 s (3 s with --quick): live and dead tuples, heap and index sizes of
deliveries and of each history table (summed over its partitions), the claim index, the
engine's claim latency histogram (engine_claim_duration_seconds), and the backlog. Reported
per 30 s window and over the soak, with the verdict line: whether the partitioned variant
kept claim p99 and the history tables' dead tuples flat where the delete variant did not.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import stack
from bench.harness.bloat import (
    CLAIM_INDEX,
    DESTINATIONS,
    FAIL_PERCENT,
    FAN_OUT,
    PAYLOAD,
    QUICK_NAPTIME,
    RETRY_SCHEDULE,
    TABLE_SAMPLE,
)
from bench.harness.live import Live
from bench.harness.partition_migration import (
    BEFORE_PARTITIONS,
    old_engine_revision,
    schema_up_to,
)
from bench.harness.report import Report, figure_rows
from bench.harness.tenant_migration import OldEngine, old_engine_checkout
from engine.db.migrate import migrate
from engine.observe.metrics import CLAIM_LATENCY_BUCKETS
from engine.testing.fakedest import FakeDestination

MODES = ("partitions", "deletes")
HISTORY_TABLES = ("events", "finished_deliveries", "delivery_attempts")
TABLES = ("deliveries", *HISTORY_TABLES)
SQL = Path(__file__).with_name("sql")
HISTORY_FILL = (SQL / "history_fill.sql").read_text()
RELAYOUT = (SQL / "history_relayout.sql").read_text()
SOAK_ENQUEUE = (SQL / "soak_enqueue.sql").read_text()
DRIVER = Path(__file__).with_name("retention_driver.py")
# The engines' own retention removes nothing: the driver is the only retention.
ENGINE_CONFIG = "breaker_threshold = 1000000\nretention_days = 3650\n"
DRIVER_EVERY_S = 5.0
RATE, RATE_QUICK = 40.0, 30.0  # events/s per variant
WINDOW_S = 30.0
# Flat, the verdict's words: the history tables' dead tuples never above this share of
# their live rows, and the claim p99 of the soak's second half (median of its windows) at
# most one histogram bucket above the first half's.
FLAT_DEAD_SHARE = 0.05


@dataclass
class Variant:
    mode: str
    dsn: str
    destinations: list[int] = field(default_factory=list)
    engine: stack.Engine | None = None
    driver: subprocess.Popen[bytes] | None = None
    driver_log: Path | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    hists: list[tuple[float, list[tuple[float, float]]]] = field(default_factory=list)
    enqueued: int = 0
    runs: list[dict[str, Any]] = field(default_factory=list)  # the driver's lines
    seeded: dict[str, int] = field(default_factory=dict)


class SqlLoader(stack.Loader):
    """stack.Loader writing with soak_enqueue.sql instead of this checkout's enqueue
    statement, which the engine from before partitions' schema lacks a table for: both
    variants load the same rows the same way. Event i goes to FAN_OUT consecutive
    destinations, as bloat routes them."""

    def __init__(self, dsn: str, rate: float, destinations: list[int]) -> None:
        super().__init__(dsn, rate, lambda i: [], PAYLOAD)
        self.destinations = destinations

    def _run(self) -> None:
        started = time.monotonic()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                due = int(self.rate * (time.monotonic() - started + self.PERIOD_S))
                if due > self.enqueued:
                    stack.run_sql(conn, SOAK_ENQUEUE, (due - self.enqueued, self.destinations,
                                                       self.enqueued, self.payload, FAN_OUT))
                    conn.execute(stack.NOTIFY)
                    self.enqueued = due
                self._stop.wait(self.PERIOD_S)


def seed(dsn: str, days: int, events_per_day: int, destinations: list[int]) -> dict[str, int]:
    """`days` days of delivered history ending a day ago, one statement a day, then VACUUM
    ANALYZE (a database in its steady state is vacuumed)."""
    step_s = 86400.0 / events_per_day
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        start = row[0] - dt.timedelta(days=days)
        for day in range(days - 1):
            first = start + dt.timedelta(days=day)
            stack.run_sql(conn, HISTORY_FILL, (events_per_day, destinations, PAYLOAD, first,
                                               f"{step_s} seconds", FAN_OUT))
        for table in HISTORY_TABLES:
            conn.execute(f"VACUUM ANALYZE {table}")
        counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone() for t in HISTORY_TABLES}
    return {t: int(c[0]) if c else 0 for t, c in counts.items()}


def sample(variant: Variant, conn: psycopg.Connection, at_s: float) -> dict[str, Any]:
    rows = stack.run_sql(conn, TABLE_SAMPLE, (list(TABLES), [CLAIM_INDEX]))
    tables = {r[0]: {"live": r[1], "dead": r[2], "dead_made": r[3], "heap_bytes": r[5],
                     "index_bytes": r[6], "autovacuum_count": r[7]} for r in rows}
    backlog = conn.execute("SELECT count(*) FROM deliveries").fetchone()
    assert variant.engine is not None
    with suppress(OSError):
        variant.hists.append((at_s, stack.histogram(variant.engine.metrics_text(),
                                                    "engine_claim_duration_seconds")))
    history = [tables.get(t, {}) for t in HISTORY_TABLES]
    return {"t": round(at_s, 1), "tables": tables, "backlog": backlog[0] if backlog else None,
            "history_dead": sum(h.get("dead") or 0 for h in history),
            "history_live": sum(h.get("live") or 0 for h in history),
            "history_bytes": sum((h.get("heap_bytes") or 0) + (h.get("index_bytes") or 0)
                                 for h in history)}


def run(admin_dsn: str, args: Any, report: Report, live: Live) -> None:
    soak_s = args.duration or (60.0 if args.quick else 600.0)
    interval = 3.0 if args.quick else 5.0
    # Below bloat's own rates (80 and 120): two engines of one process each, on a shared
    # 2-core machine, keep up with this, so claim latency is not a backlog's.
    rate = RATE_QUICK if args.quick else RATE
    day_s = args.history_day_s or (10.0 if args.quick else 30.0)
    days = math.ceil(soak_s / day_s) + 2
    events_per_day = int(rate * day_s)
    modes = list(MODES) if args.history == "both" else [args.history]
    revision = old_engine_revision() if "deletes" in modes else None
    report.data["settings"] = {
        "history": modes, "soak_s": soak_s, "sample_every_s": interval,
        "events_per_s_per_variant": rate, "fan_out": FAN_OUT, "destinations": DESTINATIONS,
        "fail_percent": FAIL_PERCENT, "retry_schedule": RETRY_SCHEDULE,
        "engine_procs_per_variant": 1, "day_s": day_s, "days_seeded": days - 1,
        "events_per_day": events_per_day, "driver_every_s": DRIVER_EVERY_S,
        "old_engine_revision": revision and subprocess.run(
            ["git", "rev-parse", revision], cwd=stack.ROOT, capture_output=True, text=True,
            check=True).stdout.strip(),
    }
    with ExitStack() as stack_:
        live.phase("creating databases")
        variants = []
        for mode in modes:
            dsn = stack_.enter_context(stack.fresh_database(
                admin_dsn, f"engine_bench_bloat_{mode}", migrated=mode == "partitions"))
            if mode == "deletes":
                folder = Path(stack_.enter_context(tempfile.TemporaryDirectory()))
                migrate(dsn, schema_up_to(folder, BEFORE_PARTITIONS))
            else:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    stack.run_sql(conn, RELAYOUT, (days + 1,))
            variants.append(Variant(mode, dsn))
        if args.quick and not args.dsn:
            stack_.enter_context(stack.server_setting(admin_dsn, "autovacuum_naptime",
                                                      QUICK_NAPTIME))
        report.data["postgres"] = stack.pg_settings(variants[0].dsn)
        dest = stack_.enter_context(FakeDestination(
            secrets=[stack.SECRET], extra_args=["--keep", "0"]))
        work = Path(stack_.enter_context(tempfile.TemporaryDirectory()))
        config = work / "engine.toml"
        config.write_text(ENGINE_CONFIG)
        checkout = (stack_.enter_context(old_engine_checkout(None, revision))
                    if revision else None)
        live.phase("seeding history")
        for v in variants:
            with psycopg.connect(v.dsn, autocommit=True) as conn:
                v.destinations = [stack.add_destination(
                    conn, dest.url(f"flaky/{FAIL_PERCENT}/{v.mode}/{i}"), 2000)
                    for i in range(DESTINATIONS)]
            v.seeded = seed(v.dsn, days, events_per_day, v.destinations)
        live.phase("starting engines")
        extra = ["--retry-schedule", RETRY_SCHEDULE, "--config", str(config),
                 "--worker-nice", "0"]
        for v in variants:
            if v.mode == "deletes":
                assert checkout is not None
                old = OldEngine(checkout, v.dsn, 1, work / "old-engine.log")
                old.argv += extra
                v.engine = old
            else:
                v.engine = stack.Engine(v.dsn, 1, extra)
        stack_.enter_context(stack.engines([v.engine for v in variants if v.engine]))
        conns = [stack_.enter_context(psycopg.connect(v.dsn, autocommit=True))
                 for v in variants]
        live.phase("soak")
        loaders = [stack_.enter_context(SqlLoader(v.dsn, rate, v.destinations))
                   for v in variants]
        for v in variants:
            v.driver_log = work / f"driver-{v.mode}.jsonl"
            tree = str(checkout) if v.mode == "deletes" else str(stack.ROOT)
            with v.driver_log.open("wb") as out:
                v.driver = subprocess.Popen(
                    [sys.executable, str(DRIVER), v.dsn, "--start-days", str(days),
                     "--day-seconds", str(day_s), "--every", str(DRIVER_EVERY_S)],
                    env={"PYTHONPATH": tree, "PATH": "/usr/bin:/bin"}, stdout=out,
                    stderr=subprocess.STDOUT)
            stack_.callback(stop_driver, v)
        started = time.monotonic()
        next_sample = started
        while (now := time.monotonic() - started) < soak_s:
            if time.monotonic() >= next_sample:
                next_sample += interval
                for v, conn in zip(variants, conns, strict=True):
                    if v.engine is None or not v.engine.alive():
                        raise stack.BenchError(f"the {v.mode} engine exited mid-soak")
                    if v.driver is not None and v.driver.poll() is not None:
                        raise stack.BenchError(f"the {v.mode} retention driver exited: "
                                               f"see {v.driver_log}")
                    v.samples.append(sample(v, conn, now))
                live.figures(" | ".join(
                    f"{v.mode}: history dead {v.samples[-1]['history_dead']:,}"
                    for v in variants))
            time.sleep(0.5)
        for v, loader in zip(variants, loaders, strict=True):
            v.enqueued = loader.enqueued
        for v in variants:
            stop_driver(v)
            v.runs = read_driver(v)
        report.data["driver_runs"] = {v.mode: v.runs for v in variants}
        report.data["destination"] = stack.destination_totals(dest)
        if checkout is not None:
            old_engines = [v.engine for v in variants if isinstance(v.engine, OldEngine)]
            report.data["old_engine_error_lines"] = old_engines[0].error_lines()
    write(report, variants, soak_s)


def stop_driver(v: Variant) -> None:
    if v.driver is not None and v.driver.poll() is None:
        v.driver.terminate()
        try:
            v.driver.wait(60)
        except subprocess.TimeoutExpired:
            v.driver.kill()
            v.driver.wait()


def read_driver(v: Variant) -> list[dict[str, Any]]:
    runs = []
    assert v.driver_log is not None
    for line in v.driver_log.read_text().splitlines():
        try:
            runs.append(json.loads(line))
        except json.JSONDecodeError:
            runs.append({"output": line[:300]})
    return runs


def window_p99_ms(hists: list[tuple[float, list[tuple[float, float]]]], start: float,
                  end: float) -> float | None:
    """The claim p99 (bucket bound, ms) of the claims made between the first and the last
    histogram reading inside [start, end]."""
    inside = [h for t, h in hists if start <= t <= end]
    if len(inside) < 2:
        return None
    return stack.histogram_quantiles_ms(inside[0], inside[-1])["p99_le_ms"]


def windows(v: Variant, soak_s: float) -> list[dict[str, Any]]:
    found = []
    start = 0.0
    while start < soak_s - 1:
        end = min(start + WINDOW_S, soak_s)
        inside = [s for s in v.samples if start <= s["t"] <= end]
        if inside:
            last = inside[-1]
            found.append({
                "from_s": start, "to_s": round(end, 1),
                "claim_p99_le_ms": window_p99_ms(v.hists, start, end),
                "history_dead_max": max(s["history_dead"] for s in inside),
                "history_dead_end": last["history_dead"],
                "history_live_end": last["history_live"],
                "history_mib_end": round(last["history_bytes"] / 2**20, 1),
                "deliveries_dead_max": max((s["tables"].get("deliveries") or {}).get("dead")
                                           or 0 for s in inside),
                "deliveries_mib_end": round(sum(
                    (last["tables"].get("deliveries") or {}).get(k) or 0
                    for k in ("heap_bytes", "index_bytes")) / 2**20, 2),
                "backlog_end": last["backlog"],
            })
        start = end
    return found


def _bucket_index(bound_ms: float | None) -> int:
    bounds = [b * 1000 for b in CLAIM_LATENCY_BUCKETS]
    if bound_ms is None:
        return 0
    return next((i for i, b in enumerate(bounds) if bound_ms <= b + 1e-9), len(bounds))


def summarize(v: Variant, soak_s: float) -> dict[str, Any]:
    ws = windows(v, soak_s)
    half = len(ws) // 2
    first = [w["claim_p99_le_ms"] for w in ws[:half] if w["claim_p99_le_ms"] is not None]
    second = [w["claim_p99_le_ms"] for w in ws[half:] if w["claim_p99_le_ms"] is not None]
    first_p99 = statistics.median_low(first) if first else None
    second_p99 = statistics.median_low(second) if second else None
    dead_share = max((s["history_dead"] / max(s["history_live"], 1) for s in v.samples),
                     default=0.0)
    claim_flat = (first_p99 is not None and second_p99 is not None
                  and _bucket_index(second_p99) <= _bucket_index(first_p99) + 1)
    runs = [r for r in v.runs if "job" in r]
    removed = {k: sum(int(r.get(k) or 0) for r in runs)
               for k in ("dropped", "finished_deliveries", "delivery_attempts", "events")}
    return {
        "windows": ws, "claim_p99_first_half_le_ms": first_p99,
        "claim_p99_second_half_le_ms": second_p99,
        "claim_p99_max_le_ms": max((w["claim_p99_le_ms"] or 0 for w in ws), default=None),
        "history_dead_peak": max((s["history_dead"] for s in v.samples), default=0),
        "history_dead_peak_share": round(dead_share, 4),
        "history_dead_flat": dead_share <= FLAT_DEAD_SHARE, "claim_p99_flat": claim_flat,
        "seeded": v.seeded, "events_enqueued": v.enqueued,
        "driver_runs": len(runs), "driver_removed": removed,
        "driver_ms_max": max((r["ms"] for r in runs), default=None),
        "driver_gave_up_waiting": sum(int(r.get("gave_up_waiting") or 0) for r in runs),
    }


def verdict(s: dict[str, dict[str, Any]]) -> str:
    if set(s) != set(MODES):
        return "verdict: needs both variants (--history both)"
    p, d = s["partitions"], s["deletes"]
    holds = (p["history_dead_flat"] and p["claim_p99_flat"]
             and not (d["history_dead_flat"] and d["claim_p99_flat"]))

    def words(x: dict[str, Any]) -> str:
        return (f"history dead peak {x['history_dead_peak']:,} "
                f"({x['history_dead_peak_share']:.1%} of live, "
                f"{'flat' if x['history_dead_flat'] else 'not flat'}), claim p99 "
                f"<= {_ms(x['claim_p99_first_half_le_ms'])} then "
                f"<= {_ms(x['claim_p99_second_half_le_ms'])} ms "
                f"({'flat' if x['claim_p99_flat'] else 'not flat'})")

    return (f"verdict: {'YES' if holds else 'NO'}, the partitioned variant keeps claim p99 "
            f"and the history tables' dead tuples flat where the delete variant does not "
            f"(partitions: {words(p)}; deletes: {words(d)})")


def _ms(v: float | None) -> str:
    return "n/a" if v is None else ("> 2,500" if v == float("inf") else f"{v:,.0f}")


def write(report: Report, variants: list[Variant], soak_s: float) -> None:
    summaries = {v.mode: summarize(v, soak_s) for v in variants}
    report.data["variants"] = summaries
    report.data["samples"] = {v.mode: v.samples for v in variants}
    settings = report.data["settings"]
    for mode, s in summaries.items():
        report.headline.append(
            f"{mode}: removed {json.dumps(s['driver_removed'])} in {s['driver_runs']} runs "
            f"(longest {s['driver_ms_max']} ms); history dead peak {s['history_dead_peak']:,}"
            f"; claim p99 max <= {_ms(s['claim_p99_max_le_ms'])} ms")
    report.headline.append(verdict(summaries))
    report.section("Setup", (
        f"{soak_s:.0f} s soak, the variants at once on one server, each its own database and "
        f"`engine --procs 1`, {settings['events_per_s_per_variant']:.0f} events/s x {FAN_OUT} "
        f"destinations, {FAIL_PERCENT} % of attempts failing, retries after {RETRY_SCHEDULE}. "
        f"One day passes every {settings['day_s']:.0f} s: {settings['days_seeded']} days of "
        f"{settings['events_per_day']:,} events seeded before the soak, and the history job "
        f"run every {DRIVER_EVERY_S:.0f} s with retention_days falling a day per "
        f"{settings['day_s']:.0f} s. deletes: the engine at "
        f"`{settings['old_engine_revision']}` (schema 024), its retention's batch deletes; "
        "partitions: this checkout, day partitions dropped. Claim p99: the bucket bound of "
        "the engine's own histogram over the window. History: events, finished_deliveries "
        "and delivery_attempts, summed over their partitions."))
    report.table(["variant", "seeded rows", "removed by the driver", "driver runs",
                  "longest run ms", "lock waits given up", "events enqueued"],
                 [[m, json.dumps(s["seeded"]), json.dumps(s["driver_removed"]),
                   s["driver_runs"], s["driver_ms_max"], s["driver_gave_up_waiting"],
                   s["events_enqueued"]] for m, s in summaries.items()])
    report.section(f"Every {WINDOW_S:.0f} s")
    report.table(["variant", "window s", "claim p99 ms", "history dead max", "history dead "
                  "end", "history live end", "history MiB", "deliveries dead max",
                  "deliveries MiB", "backlog"],
                 [[m, f"{w['from_s']:.0f}-{w['to_s']:.0f}", _ms(w["claim_p99_le_ms"]),
                   w["history_dead_max"], w["history_dead_end"], w["history_live_end"],
                   w["history_mib_end"], w["deliveries_dead_max"], w["deliveries_mib_end"],
                   w["backlog_end"]]
                  for m, s in summaries.items() for w in s["windows"]])
    report.section("Verdict", verdict(summaries) + (
        f"\n\nFlat: the history tables' dead tuples never above {FLAT_DEAD_SHARE:.0%} of "
        "their live rows; claim p99 in the soak's second half (median of its windows) at most "
        "one histogram bucket above the first half's."))
    fig, axes = figure_rows("History dead tuples and claim p99 during the soak", 2)
    for v in variants:
        axes[0].plot([s["t"] for s in v.samples], [s["history_dead"] for s in v.samples],
                     label=v.mode)
        ws = summaries[v.mode]["windows"]
        axes[1].plot([w["to_s"] for w in ws],
                     [min(w["claim_p99_le_ms"] or 0, 3000) for w in ws], label=v.mode,
                     drawstyle="steps-pre")
    axes[0].set_ylabel("dead tuples, history tables")
    axes[1].set_ylabel(f"claim p99 per {WINDOW_S:.0f} s (ms, bucket bound)")
    axes[1].set_xlabel("seconds into the soak")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.legend()
    report.plot(fig, "bloat_history.png", "History dead tuples and claim p99")

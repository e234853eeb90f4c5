"""bloat: a soak with >= 30 % of attempts failing and retrying, three variants side by side
(at the same time, each in its own database on the same server, so they share the machine
and its load): the schema's per-table autovacuum settings, PostgreSQL's defaults (the
per-table settings reset), and the schema's settings with a transaction holding xmin for
the whole soak. Sampled every few seconds: live and dead tuples, table and index sizes,
autovacuum runs and their durations, the engine's claim latency p99 and what
`engine status` warned. Ends with autovacuum advice derived from the schema variant."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench.harness import stack
from bench.harness.live import Live
from bench.harness.report import Report, figure, figure_rows
from engine.observe import autovacuum_advice
from engine.observe.status import collect_status
from engine.testing.fakedest import FakeDestination

if TYPE_CHECKING:
    from matplotlib.axes import Axes

TABLES = ("deliveries", "delivery_attempts", "finished_deliveries", "events")
CLAIM_INDEX = "deliveries_claimable_idx"
VARIANTS = ("schema", "pg-defaults", "xmin-held")
FAIL_PERCENT = 40  # of first attempts; retries fail as often
DESTINATIONS = 4
FAN_OUT = 2
RETRY_SCHEDULE = "1s,2s,4s,8s"
# A soak measures vacuum, not the breaker: with 40 % failures, 5 in a row happen every
# few hundred attempts and would pause the destinations for most of the run.
ENGINE_CONFIG = "breaker_threshold = 1000000\n"
QUICK_NAPTIME = "5s"
TOP_CLAIM_BUCKET_MS = 2500.0  # engine/observe/metrics.py CLAIM_LATENCY_BUCKETS' last bound
PAYLOAD = '{"order": 42, "note": "' + "x" * 400 + '"}'
SQL = Path(__file__).with_name("sql")
TABLE_SAMPLE = (SQL / "table_sample.sql").read_text()
VACUUM_PROGRESS = (SQL / "vacuum_progress.sql").read_text()
RESET_AUTOVACUUM = (SQL / "reset_autovacuum.sql").read_text()
RELOPTIONS = (SQL / "reloptions.sql").read_text()


@dataclass
class Variant:
    name: str
    dsn: str
    destinations: list[int] = field(default_factory=list)
    engine: stack.Engine | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    warnings: dict[str, float] = field(default_factory=dict)  # warning -> first seen, s
    enqueued: int = 0
    vacuum_seen: dict[str, float] = field(default_factory=dict)  # table -> started, s
    vacuum_runs_s: dict[str, list[float]] = field(default_factory=dict)
    claim_hist: list[tuple[float, float]] = field(default_factory=list)
    reloptions: dict[str, list[str]] = field(default_factory=dict)


def route(variant: Variant, index: int) -> list[int]:
    """Event `index` goes to FAN_OUT consecutive destinations of the variant."""
    return [variant.destinations[(index + k) % DESTINATIONS] for k in range(FAN_OUT)]


def sample(variant: Variant, conn: psycopg.Connection, at_s: float) -> dict[str, Any]:
    rows = stack.run_sql(conn, TABLE_SAMPLE, (list(TABLES), [CLAIM_INDEX]))
    tables = {r[0]: {"live": r[1], "dead": r[2], "dead_made": r[3], "inserted": r[4],
                     "heap_bytes": r[5], "index_bytes": r[6], "autovacuum_count": r[7],
                     "autovacuum_ms": r[8]} for r in rows}
    point: dict[str, Any] = {"t": round(at_s, 1), "tables": tables}
    assert variant.engine is not None
    try:
        hist = stack.histogram(variant.engine.metrics_text(), "engine_claim_duration_seconds")
        point["claim"] = stack.histogram_quantiles_ms(variant.claim_hist, hist)
        variant.claim_hist = hist
    except OSError:
        point["claim"] = None
    status = collect_status(conn, 5)
    for table in status["tables"]:
        if table["name"] in tables:
            tables[table["name"]]["vacuum_trigger"] = table["vacuum_trigger"]
    for warning in status["warnings"]:
        # Numbers change between samples; keep one line per kind and table.
        variant.warnings.setdefault(warning.split(":")[0], at_s)
        point.setdefault("warnings", []).append(warning)
    point["backlog"] = status["queue"].get("pending") if isinstance(status["queue"], dict) \
        else None
    return point


def watch_vacuums(variant: Variant, conn: psycopg.Connection, at_s: float) -> None:
    """Time vacuums from pg_stat_progress_vacuum: first seen to last seen (to 0.5 s)."""
    running = {r[0] for r in stack.run_sql(conn, VACUUM_PROGRESS)}
    for table in running:
        variant.vacuum_seen.setdefault(table, at_s)
    for table in [t for t in variant.vacuum_seen if t not in running]:
        started = variant.vacuum_seen.pop(table)
        variant.vacuum_runs_s.setdefault(table, []).append(round(at_s - started, 1))


def run(admin_dsn: str, args: Any, report: Report, live: Live) -> None:
    if getattr(args, "history", None):
        from bench.harness import bloat_history

        bloat_history.run(admin_dsn, args, report, live)
        return
    soak_s = args.duration or (60.0 if args.quick else 600.0)
    interval = 3.0 if args.quick else 5.0
    rate = 80.0 if args.quick else 120.0
    report.data["settings"] = {
        "soak_s": soak_s, "sample_every_s": interval, "events_per_s_per_variant": rate,
        "fan_out": FAN_OUT, "destinations": DESTINATIONS, "fail_percent": FAIL_PERCENT,
        "retry_schedule": RETRY_SCHEDULE, "engine_procs_per_variant": 1,
        "variants": VARIANTS,
    }
    with ExitStack() as stack_:
        live.phase("creating databases")
        variants = [Variant(name, dsn) for name, dsn in zip(VARIANTS, stack_.enter_context(
            stack.fresh_databases(admin_dsn, [f"engine_bench_bloat_{name.replace('-', '_')}"
                                              for name in VARIANTS])), strict=True)]
        if args.quick and not args.dsn:
            # A 60 s soak under the stock 60 s naptime would see one autovacuum round at
            # most: --quick compresses time on the server it owns (reported in settings).
            stack_.enter_context(stack.server_setting(admin_dsn, "autovacuum_naptime",
                                                      QUICK_NAPTIME))
        report.data["postgres"] = stack.pg_settings(variants[0].dsn)
        dest = stack_.enter_context(FakeDestination(
            secrets=[stack.SECRET], extra_args=["--keep", "0"]))
        config = Path(stack_.enter_context(tempfile.TemporaryDirectory())) / "engine.toml"
        config.write_text(ENGINE_CONFIG)
        for v in variants:
            with psycopg.connect(v.dsn, autocommit=True) as conn:
                if v.name == "pg-defaults":
                    stack.run_sql(conn, RESET_AUTOVACUUM)
                v.reloptions = dict(stack.run_sql(conn, RELOPTIONS, (list(TABLES),)))
                v.destinations = [stack.add_destination(
                    conn, dest.url(f"flaky/{FAIL_PERCENT}/{v.name}/{i}"), 2000)
                    for i in range(DESTINATIONS)]
        live.phase("starting engines")
        for v in variants:
            # Niceness 0: no ingress here to give way to (the loader writes directly).
            v.engine = stack.Engine(v.dsn, 1, ["--retry-schedule", RETRY_SCHEDULE,
                                               "--config", str(config), "--worker-nice", "0"])
        stack_.enter_context(stack.engines([v.engine for v in variants if v.engine]))
        stack_.enter_context(stack.held_xmin(variants[VARIANTS.index("xmin-held")].dsn))
        conns = [stack_.enter_context(psycopg.connect(v.dsn, autocommit=True))
                 for v in variants]
        live.phase("soak")
        loaders = [stack_.enter_context(stack.Loader(v.dsn, rate, partial(route, v), PAYLOAD))
                   for v in variants]
        started = time.monotonic()
        next_sample = started
        while (now := time.monotonic() - started) < soak_s:
            for v, conn in zip(variants, conns, strict=True):
                watch_vacuums(v, conn, now)
            if time.monotonic() >= next_sample:
                next_sample += interval
                for v, conn in zip(variants, conns, strict=True):
                    if v.engine is None or not v.engine.alive():
                        raise stack.BenchError(f"the {v.name} engine exited mid-soak")
                    v.samples.append(sample(v, conn, now))
                live.figures(" | ".join(
                    f"{v.name}: dead {v.samples[-1]['tables']['deliveries']['dead']:,}"
                    for v in variants))
            time.sleep(0.5)
        for v, loader in zip(variants, loaders, strict=True):
            v.enqueued = loader.enqueued
        report.data["destination"] = stack.destination_totals(dest)
    write(report, variants, soak_s)


def summarize(v: Variant) -> dict[str, Any]:
    first, last = v.samples[0], v.samples[-1]
    span = max(last["t"] - first["t"], 1e-9)
    tables = {}
    for name in TABLES:
        a, b = first["tables"].get(name), last["tables"].get(name)
        if not a or not b:
            continue
        runs = (b["autovacuum_count"] or 0) - (a["autovacuum_count"] or 0)
        total_ms = None if b["autovacuum_ms"] is None else (
            b["autovacuum_ms"] - (a["autovacuum_ms"] or 0))
        observed = v.vacuum_runs_s.get(name, [])
        tables[name] = {
            "dead_peak": max(s["tables"][name]["dead"] for s in v.samples),
            "dead_end": b["dead"],
            "dead_per_s": round((b["dead_made"] - a["dead_made"]) / span, 1),
            "inserts_per_s": round((b["inserted"] - a["inserted"]) / span, 1),
            "live_end": b["live"],
            "heap_bytes_start": a["heap_bytes"], "heap_bytes_end": b["heap_bytes"],
            "index_bytes_end": b["index_bytes"],
            "autovacuum_runs": runs,
            "autovacuum_mean_s": round(total_ms / runs / 1000, 2) if runs and total_ms
            else (round(sum(observed) / len(observed), 2) if observed else None),
            "vacuums_observed_s": observed,
            "vacuum_trigger": b.get("vacuum_trigger"),
        }
    claim_p99 = [s["claim"]["p99_le_ms"] for s in v.samples
                 if s.get("claim") and s["claim"]["p99_le_ms"] is not None]
    return {
        "tables": tables, "claim_index_bytes_end": last["tables"].get(CLAIM_INDEX, {}).get(
            "index_bytes"),
        "claim_p99_max_le_ms": max(claim_p99, default=None),
        "claim_p99_last_le_ms": claim_p99[-1] if claim_p99 else None,
        "events_enqueued": v.enqueued, "warnings_first_seen_s": v.warnings,
        "reloptions": v.reloptions,
    }


def write(report: Report, variants: list[Variant], soak_s: float) -> None:
    summaries = {v.name: summarize(v) for v in variants}
    report.data["variants"] = summaries
    report.data["samples"] = {v.name: v.samples for v in variants}
    schema = summaries["schema"]
    measured = autovacuum_advice.Measured.from_report_tables(
        schema["tables"], naptime_s=_seconds(report.data["postgres"].get("autovacuum_naptime")))
    advice = autovacuum_advice.advise(measured)
    report.data["autovacuum_measured"] = [m.as_dict() for m in measured]
    report.data["autovacuum_advice"] = [a.as_dict() for a in advice]
    for v in variants:
        s = summaries[v.name]
        report.headline.append(
            f"{v.name}: deliveries dead-tuple peak {s['tables']['deliveries']['dead_peak']:,},"
            f" claim p99 {_le(s['claim_p99_max_le_ms'])} ms,"
            f" {s['tables']['deliveries']['autovacuum_runs']} autovacuums of deliveries,"
            f" {len(s['warnings_first_seen_s'])} kinds of status warning")
    report.headline.append(f"advice: {len(advice)} statements "
                           "(engine tune-autovacuum REPORT prints them, --apply runs them)")
    report.section("Variants side by side", (
        f"{soak_s:.0f} s soak, all three at once on one server; each has its own database "
        f"and `engine --procs 1`, {report.data['settings']['events_per_s_per_variant']:.0f} "
        f"events/s x {FAN_OUT} destinations, {FAIL_PERCENT} % of attempts failing, retries "
        f"after {RETRY_SCHEDULE}. Claim p99 is the bucket bound of the engine's own "
        "histogram (engine_claim_duration_seconds)."))
    report.table(
        ["variant", "deliveries dead peak", "deliveries heap end", "claim index end",
         "autovacuums (deliveries)", "mean vacuum s", "claim p99 max (ms)", "events"],
        [[v.name, summaries[v.name]["tables"]["deliveries"]["dead_peak"],
          _mb(summaries[v.name]["tables"]["deliveries"]["heap_bytes_end"]),
          _mb(summaries[v.name]["claim_index_bytes_end"]),
          summaries[v.name]["tables"]["deliveries"]["autovacuum_runs"],
          summaries[v.name]["tables"]["deliveries"]["autovacuum_mean_s"],
          _le(summaries[v.name]["claim_p99_max_le_ms"]), summaries[v.name]["events_enqueued"]]
         for v in variants])
    report.section("Every table, every variant")
    report.table(
        ["variant", "table", "dead/s made", "inserts/s", "dead peak", "dead end", "heap end",
         "indexes end", "autovacuums", "mean vacuum s"],
        [[v.name, name, t["dead_per_s"], t["inserts_per_s"], t["dead_peak"], t["dead_end"],
          _mb(t["heap_bytes_end"]), _mb(t["index_bytes_end"]), t["autovacuum_runs"],
          t["autovacuum_mean_s"]]
         for v in variants for name, t in summaries[v.name]["tables"].items()])
    report.section("What `engine status` warned", "\n".join(
        f"- **{v.name}**: " + ("; ".join(f"{w} (from {t:.0f} s)" for w, t in
                                         summaries[v.name]["warnings_first_seen_s"].items())
                               or "nothing") for v in variants))
    plots(report, variants)
    report.section("Autovacuum advice", (
        "Derived from the `schema` variant's measurements; `engine tune-autovacuum "
        f"{report.folder}/report.json [--apply]` prints (applies) them.\n\n```sql\n"
        + "\n".join(a.text() for a in advice) + "\n```"))


def plots(report: Report, variants: list[Variant]) -> None:
    fig, axes = figure_rows("deliveries: dead tuples and claim latency during the soak", 2)
    for v in variants:
        t = [s["t"] for s in v.samples]
        axes[0].plot(t, [s["tables"]["deliveries"]["dead"] for s in v.samples], label=v.name)
        # Past the histogram's top bucket a claim is only known to be slower: drawn there.
        axes[1].plot(t, [min((s.get("claim") or {}).get("p99_le_ms") or 0, 1.2 *
                             TOP_CLAIM_BUCKET_MS) for s in v.samples],
                     label=v.name, drawstyle="steps-post")
    _soak_axes(axes, "dead tuples", "claim p99 (ms, bucket bound;\n3,000 = over 2,500)")
    report.plot(fig, "bloat_dead_tuples.png", "Dead tuples in deliveries and claim p99")

    fig, axes = figure_rows("Sizes during the soak", 2)
    for v in variants:
        t = [s["t"] for s in v.samples]
        axes[0].plot(t, [(s["tables"]["deliveries"]["heap_bytes"] +
                          s["tables"]["deliveries"]["index_bytes"]) / 2**20 for s in v.samples],
                     label=v.name)
        axes[1].plot(t, [s["tables"][CLAIM_INDEX]["index_bytes"] / 2**20 for s in v.samples],
                     label=v.name)
    _soak_axes(axes, "deliveries heap + indexes (MiB)", f"{CLAIM_INDEX} (MiB)")
    report.plot(fig, "bloat_sizes.png", "Table and claim index sizes")

    fig, ax = figure("Dead tuples per table (schema settings)", size=(9.5, 4.2))
    schema = next(v for v in variants if v.name == "schema")
    for name in TABLES:
        ax.plot([s["t"] for s in schema.samples],
                [s["tables"][name]["dead"] for s in schema.samples], label=name)
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.set_ylabel("dead tuples")
    ax.set_xlabel("seconds into the soak")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the sawtooth, not on it
    report.plot(fig, "bloat_tables.png", "Dead tuples per table")


def _soak_axes(axes: Sequence[Axes], top_label: str, bottom_label: str) -> None:
    """Two stacked plots over the soak's seconds, one line per variant."""
    axes[0].set_ylabel(top_label)
    axes[1].set_ylabel(bottom_label)
    axes[1].set_xlabel("seconds into the soak")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
        ax.legend(title="autovacuum")


def _le(bound: float | None) -> str:
    """A histogram bucket bound as a reader takes it: '<= 250', or '> 2500' past the top."""
    if bound is None:
        return "n/a"
    return f"> {TOP_CLAIM_BUCKET_MS:,.0f}" if bound == float("inf") else f"<= {bound:,.0f}"


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.2f} MiB"


def _seconds(value: str | None) -> float:
    if not value:
        return 60.0
    units = {"ms": 0.001, "s": 1.0, "min": 60.0}
    for unit, factor in units.items():
        if value.endswith(unit) and value[: -len(unit)].isdigit():
            return int(value[: -len(unit)]) * factor
    return float(value) if value.isdigit() else 60.0

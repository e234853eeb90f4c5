"""Per-table autovacuum settings derived from what a bench/run.sh bloat soak measured, and
the `engine tune-autovacuum REPORT [--apply]` command that prints (or applies) them.

The rule, per table: autovacuum cannot look at a table more often than once per
autovacuum_naptime, and a vacuum that takes V seconds should not run back to back, so aim
at one vacuum every max(naptime, 4 V, 10 s). A table that makes D dead tuples per second
should then trigger at half of D x that interval, so that every look finds it due and
dead tuples stay under about D x interval, as a fixed count (scale factor 0): the queue
table's size follows the backlog, not the garbage, so a percentage is wrong at both ends.
An append-mostly table (attempt history, events) needs vacuum for its visibility map and
freezing, not for dead tuples: trigger on inserts every few minutes instead of after 20 %
of a table that only grows."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from engine.db import queries
from engine.db.sql_params import TableLeavesParams

MIN_INTERVAL_S = 10.0
VACUUM_SHARE = 4  # the interval is at least this many vacuum durations
MIN_THRESHOLD = 1000
INSERT_INTERVAL_S = 300.0  # an append-only table: its visibility map a few minutes behind
MIN_INSERT_THRESHOLD = 10_000
HOT_DEAD_PER_S = 1.0  # below this a table makes too little garbage to tune for
NAPTIME_FACTOR = 4  # dead tuples one naptime makes, in triggers, before naptime is advised


class AdviceError(Exception):
    """The report cannot give advice (missing, not JSON, not a bloat report)."""


@dataclass(frozen=True)
class Measured:
    table: str
    dead_per_s: float  # rows updated or deleted per second: each leaves a dead tuple
    inserts_per_s: float
    dead_peak: int  # the most dead tuples sampled at once
    autovacuum_runs: int
    vacuum_s: float | None  # mean duration of one autovacuum, when known
    naptime_s: float
    trigger: float | None = None  # dead tuples at which autovacuum was due in the soak

    @classmethod
    def from_report_tables(cls, tables: dict[str, dict[str, Any]], naptime_s: float
                           ) -> list[Measured]:
        return [cls(name, float(t["dead_per_s"]), float(t["inserts_per_s"]),
                    int(t["dead_peak"]), int(t["autovacuum_runs"] or 0),
                    None if t.get("autovacuum_mean_s") is None else float(t["autovacuum_mean_s"]),
                    naptime_s, t.get("vacuum_trigger")) for name, t in tables.items()]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Advice:
    table: str | None  # None: a server setting (ALTER SYSTEM), not a table's
    settings: dict[str, int | float | str]
    reasons: tuple[str, str]

    def statement(self) -> str:
        if self.table is None:
            return " ".join(f"ALTER SYSTEM SET {key} = '{value}';"
                            for key, value in self.settings.items())
        options = ", ".join(f"{key} = {value}" for key, value in self.settings.items())
        return f"ALTER TABLE {self.table} SET ({options});"

    def text(self) -> str:
        return f"-- {self.reasons[0]}\n-- {self.reasons[1]}\n{self.statement()}"

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "settings": self.settings, "reasons": list(self.reasons),
                "statement": self.statement()}


def nice_ceiling(value: float) -> int:
    """The next of 1, 2, 5 x 10^k at or above `value`: a threshold a person can read."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    return next(int(step * power) for step in (1, 2, 5, 10) if step * power >= value)


def advise(measured: Sequence[Measured]) -> list[Advice]:
    found = []
    for m in measured:
        interval = max(m.naptime_s, VACUUM_SHARE * (m.vacuum_s or 0.0), MIN_INTERVAL_S)
        took = "an unmeasured time" if m.vacuum_s is None else f"{m.vacuum_s:g} s"
        if m.dead_per_s >= HOT_DEAD_PER_S:
            threshold = nice_ceiling(max(MIN_THRESHOLD, m.dead_per_s * interval / 2))
            if m.trigger and MIN_THRESHOLD <= m.trigger < threshold:
                # Autovacuum looks once per naptime whatever the trigger: a higher one
                # would only let a look pass the table by.
                threshold = int(m.trigger)
            settings: dict[str, int | float | str] = {
                "autovacuum_vacuum_scale_factor": 0, "autovacuum_vacuum_threshold": threshold,
                "autovacuum_analyze_scale_factor": 0, "autovacuum_analyze_threshold": threshold}
            # What vacuum could hold dead tuples to under the settings of the soak: its
            # trigger plus what one look's wait and one vacuum add.
            bound = round((m.trigger or 0) + m.dead_per_s * (m.naptime_s + (m.vacuum_s or 0)))
            behind = (m.autovacuum_runs > 0 and m.dead_peak > 2 * bound) or (
                m.vacuum_s is not None and VACUUM_SHARE * m.vacuum_s > m.naptime_s)
            if behind:
                settings["autovacuum_vacuum_cost_delay"] = 0
            first = (f"{m.table} made {m.dead_per_s:,.0f} dead tuples/s; autovacuum looks every "
                     f"{m.naptime_s:g} s and one vacuum took {took}: aim at one vacuum per "
                     f"{interval:g} s, triggered at {threshold:,} dead tuples (a count, not a"
                     " percentage), so each look finds it due.")
            if m.autovacuum_runs == 0:
                second = (f"no autovacuum ran during the soak (dead tuples reached "
                          f"{m.dead_peak:,}): soak longer than autovacuum_naptime to judge its"
                          " throttling.")
            elif behind:
                second = (f"dead tuples peaked at {m.dead_peak:,}, over twice the ~{bound:,} the"
                          " soak's trigger and one naptime allow: vacuum falls behind, so run "
                          "it unthrottled (cost delay 0).")
            else:
                second = (f"dead tuples peaked at {m.dead_peak:,} over {m.autovacuum_runs} "
                          f"autovacuums, within twice the ~{bound:,} the soak's trigger and one"
                          " naptime allow: vacuum keeps up, its throttling can stay.")
            found.append(Advice(m.table, settings, (first, second)))
            naptime = naptime_advice(m, threshold)
            if naptime is not None:
                found.append(naptime)
        elif m.inserts_per_s >= HOT_DEAD_PER_S:
            threshold = nice_ceiling(max(MIN_INSERT_THRESHOLD, m.inserts_per_s * INSERT_INTERVAL_S))
            found.append(Advice(
                m.table,
                {"autovacuum_vacuum_insert_scale_factor": 0,
                 "autovacuum_vacuum_insert_threshold": threshold},
                (f"{m.table} is append-mostly: {m.inserts_per_s:,.0f} inserts/s against "
                 f"{m.dead_per_s:.1f} dead tuples/s.",
                 f"vacuum it every ~{INSERT_INTERVAL_S / 60:g} min of inserts ({threshold:,}) so"
                 " its visibility map and freezing keep pace instead of waiting for 20 % growth.")))
    return found


def naptime_advice(m: Measured, threshold: int) -> Advice | None:
    """A shorter autovacuum_naptime when one naptime lets a hot table make over 4 times
    its trigger in dead tuples: no per-table setting can make autovacuum look sooner."""
    made = m.dead_per_s * m.naptime_s
    if made <= NAPTIME_FACTOR * threshold or m.naptime_s <= MIN_INTERVAL_S:
        return None
    seconds = max(int(MIN_INTERVAL_S), round(2 * threshold / m.dead_per_s))
    return Advice(None, {"autovacuum_naptime": f"{seconds}s"}, (
        f"{m.table} makes {made:,.0f} dead tuples per {m.naptime_s:g} s naptime, over "
        f"{NAPTIME_FACTOR} x its {threshold:,} trigger: autovacuum looks too rarely for it.",
        f"looking every {seconds} s finds about twice the trigger each time; server-wide (every"
        " database), then SELECT pg_reload_conf()."))


def advice_from_report(path: Path) -> list[Advice]:
    """The advice for a bloat report.json (recomputed from its measurements)."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise AdviceError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise AdviceError(f"{path} is not a JSON report") from None
    rows = data.get("autovacuum_measured") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise AdviceError(f"{path} has no autovacuum measurements: it must be the report.json"
                          " of a `bench/run.sh bloat` run")
    try:
        return advise([Measured(**row) for row in rows])
    except (TypeError, ValueError):
        raise AdviceError(f"{path}: its autovacuum measurements are malformed") from None


def apply(conn: psycopg.Connection, advice: Sequence[Advice]) -> None:
    """Apply the table settings in one transaction (all or none), then the server ones
    (ALTER SYSTEM cannot run in a transaction block) and reload the configuration. A
    partitioned table's go to each of its partitions (table_leaves.sql), and the
    partitions made later take them from the newest one (ensure_history_partitions,
    schema/027)."""
    with conn.transaction():
        for a in advice:
            if a.table is None:
                continue
            options = sql.SQL(", ").join(
                sql.SQL("{} = {}").format(sql.Identifier(key), sql.Literal(value))
                for key, value in a.settings.items())
            leaves = queries.TABLE_LEAVES.run_sync(
                conn, TableLeavesParams(table_name=a.table)).fetchall()
            for (leaf,) in leaves:
                conn.execute(sql.SQL("ALTER TABLE {} SET ({})").format(
                    sql.Identifier(leaf), options))
    system = [a for a in advice if a.table is None]
    for a in system:
        for key, value in a.settings.items():
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(
                sql.Identifier(key), sql.Literal(str(value))))
    if system:
        queries.RELOAD_SERVER_CONFIG.run_sync(conn)


def add_parser(sub: Any, add_common: Any) -> None:
    parser = sub.add_parser(
        "tune-autovacuum", help="print (or --apply) the autovacuum settings a bloat report"
                                " recommends")
    add_common(parser)
    parser.add_argument("report", type=Path, help="report.json of a `bench/run.sh bloat` run")
    parser.add_argument("--apply", action="store_true", help="run the statements")


def cmd_tune_autovacuum(settings: Any, args: argparse.Namespace) -> int:
    from engine.db.database import describe, open_database

    try:
        advice = advice_from_report(args.report)
    except AdviceError as exc:
        print(f"engine: {exc}", file=sys.stderr)
        return 2
    for a in advice:
        print(a.text())
    if not args.apply:
        return 0
    database = open_database(settings, announce=False)
    try:
        with psycopg.connect(database.dsn, autocommit=True, connect_timeout=10) as conn:
            apply(conn, advice)
    finally:
        database.close()
    print(f"applied {len(advice)} statements to {describe(database.dsn)}")
    return 0

"""Retention of the console's per-minute rollup: delivery_minutes rows past its longest
window (or past the retention cutoff, when sooner) are deleted in bounded batches, each its
own short transaction. The history tables (events, finished deliveries, attempts) are not
deleted from: they are dropped by whole partitions (partitions.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from psycopg import Connection

from engine.db import queries
from engine.db.database import repeat_until_short
from engine.db.sql_params import RetentionCutoffParams, RetentionMinutesParams
from engine.maintenance.budget import within_budget

RETENTION_BATCH = 1000
# delivery_minutes rows are kept this long (unless the retention cutoff is sooner): the
# console's longest window (24 h, engine/ingress/console_api.MAX_WINDOW_S) and an hour.
MINUTES_KEPT_S = 25 * 3600.0


@dataclass(frozen=True)
class RetentionSettings:
    retention_days: float
    interval_s: float = 300.0
    budget_s: float = 20.0
    batch: int = RETENTION_BATCH


@dataclass
class RetentionReport:
    delivery_minutes: int = 0
    batches: int = 0
    complete: bool = True  # False: stopped by the time budget, more is left for next run
    retention_days: float = 0.0  # what it applied: older than this was deleted


def cutoff_for(conn: Connection, retention_days: float) -> dt.datetime:
    """The database's now minus `retention_days`: every host's jobs cut at the same time."""
    row = queries.RETENTION_CUTOFF.run_sync(
        conn, RetentionCutoffParams(retention_seconds=retention_days * 86400.0)).fetchone()
    assert row is not None
    return row[0]


def run_retention(
    conn: Connection, retention_days: float, batch: int = RETENTION_BATCH,
    budget_s: float = 30.0, keep_going: Callable[[], bool] = lambda: True,
) -> RetentionReport:
    """Delete rollup rows past their time, a batch at a time, for at most `budget_s` (the
    rest waits for the next run) and while `keep_going()`."""
    report = RetentionReport(retention_days=retention_days)
    params = RetentionMinutesParams(cutoff=cutoff_for(conn, retention_days),
                                    batch_limit=batch, kept_seconds=MINUTES_KEPT_S)

    def one_batch() -> int:
        with conn.transaction():
            removed = queries.RETENTION_MINUTES.run_sync(conn, params).rowcount
        report.delivery_minutes += removed
        report.batches += 1
        return removed

    report.complete = repeat_until_short(one_batch, batch, within_budget(budget_s, keep_going))[1]
    return report


def run_once(conn: Connection, settings: RetentionSettings,
             keep_going: Callable[[], bool]) -> RetentionReport:
    return run_retention(conn, settings.retention_days, settings.batch, settings.budget_s,
                         keep_going)

"""Retention: old finished deliveries, their attempts, then events nothing refers to, then
the console's per-minute rollup rows past its longest window, removed in bounded batches,
each its own short transaction."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from psycopg import Connection

from engine.db import queries
from engine.db.database import repeat_until_short
from engine.db.queries import Statement
from engine.db.sql_params import (
    RetentionBatchParams,
    RetentionCutoffParams,
    RetentionMinutesParams,
)
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
    finished_deliveries: int = 0
    delivery_attempts: int = 0
    events: int = 0
    delivery_minutes: int = 0
    batches: int = 0
    complete: bool = True  # False: stopped by the time budget, more is left for next run
    retention_days: float = 0.0  # what it applied: older than this was deleted


def cutoff_for(conn: Connection, retention_days: float) -> dt.datetime:
    row = queries.RETENTION_CUTOFF.run_sync(
        conn, RetentionCutoffParams(retention_seconds=retention_days * 86400.0)).fetchone()
    assert row is not None
    return row[0]


def run_retention(
    conn: Connection, retention_days: float, batch: int = RETENTION_BATCH,
    budget_s: float = 30.0, keep_going: Callable[[], bool] = lambda: True,
) -> RetentionReport:
    """Delete what is older than `retention_days`, a batch at a time, for at most
    `budget_s` (the rest waits for the next run) and while `keep_going()`."""
    report = RetentionReport(retention_days=retention_days)
    cutoff = cutoff_for(conn, retention_days)
    params = RetentionBatchParams(cutoff=cutoff, batch_limit=batch)
    minutes_params = RetentionMinutesParams(
        cutoff=cutoff, batch_limit=batch, kept_seconds=MINUTES_KEPT_S)

    def finished_batch() -> int:
        with conn.transaction():
            row = queries.RETENTION_FINISHED.run_sync(conn, params).fetchone()
        removed = int(row[0]) if row else 0
        report.finished_deliveries += removed
        report.delivery_attempts += int(row[1]) if row else 0
        report.batches += 1
        return removed

    def rowcount_batch(statement: Statement, statement_params: tuple,
                       counted: str) -> Callable[[], int]:
        """A batch of `statement`, whose row count adds to the report's field `counted`."""
        def one_batch() -> int:
            with conn.transaction():
                removed = statement.run_sync(conn, statement_params).rowcount
            setattr(report, counted, getattr(report, counted) + removed)
            report.batches += 1
            return removed
        return one_batch

    in_budget = within_budget(budget_s, keep_going)
    batches = (finished_batch,
               rowcount_batch(queries.RETENTION_EVENTS, params, "events"),
               rowcount_batch(queries.RETENTION_MINUTES, minutes_params, "delivery_minutes"))
    for one_batch in batches:
        if not repeat_until_short(one_batch, batch, in_budget)[1]:
            report.complete = False
            return report
    return report


def run_once(conn: Connection, settings: RetentionSettings,
             keep_going: Callable[[], bool]) -> RetentionReport:
    return run_retention(conn, settings.retention_days, settings.batch, settings.budget_s,
                         keep_going)

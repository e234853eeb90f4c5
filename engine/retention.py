"""Retention: old finished deliveries, their attempts, then events nothing refers to, then
the console's per-minute rollup rows past its longest window, removed in bounded batches,
each its own short transaction."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

from psycopg import Connection

from engine import queries
from engine.queue import _run

RETENTION_BATCH = 1000
# delivery_minutes rows are kept this long (unless the retention cutoff is sooner): the
# console's longest window (24 h, engine/ingress/console_api.MAX_WINDOW_S) and an hour.
MINUTES_KEPT_S = 25 * 3600.0


@dataclass
class RetentionReport:
    finished_deliveries: int = 0
    delivery_attempts: int = 0
    events: int = 0
    delivery_minutes: int = 0
    batches: int = 0
    complete: bool = True  # False: stopped by the time budget, more is left for next run


def cutoff_for(conn: Connection, retention_days: float) -> dt.datetime:
    row = conn.execute(
        "SELECT now() - make_interval(secs => %s)", [retention_days * 86400.0]
    ).fetchone()
    assert row is not None
    return row[0]


def run_retention(
    conn: Connection, retention_days: float, batch: int = RETENTION_BATCH,
    budget_s: float = 30.0, keep_going: Callable[[], bool] = lambda: True,
) -> RetentionReport:
    """Delete what is older than `retention_days`, a batch at a time, for at most
    `budget_s` (the rest waits for the next run) and while `keep_going()`."""
    report = RetentionReport()
    cutoff = cutoff_for(conn, retention_days)
    deadline = time.monotonic() + budget_s
    steps = ((queries.RETENTION_FINISHED, (cutoff, batch)),
             (queries.RETENTION_EVENTS, (cutoff, batch)),
             (queries.RETENTION_MINUTES, (cutoff, batch, MINUTES_KEPT_S)))
    for statement, params in steps:
        while True:
            if time.monotonic() > deadline or not keep_going():
                report.complete = False
                return report
            with conn.transaction():
                cursor = _run(conn, statement, params)
                if statement is queries.RETENTION_FINISHED:
                    row = cursor.fetchone()
                    removed = int(row[0]) if row else 0
                    report.finished_deliveries += removed
                    report.delivery_attempts += int(row[1]) if row else 0
                elif statement is queries.RETENTION_EVENTS:
                    removed = cursor.rowcount
                    report.events += removed
                else:
                    removed = cursor.rowcount
                    report.delivery_minutes += removed
            report.batches += 1
            if removed < batch:
                break
    return report

"""Retention: old finished deliveries, their attempts, then events nothing refers to,
removed in bounded batches, each its own short transaction."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

from psycopg import Connection

from engine import queries
from engine.queue import _run

RETENTION_BATCH = 1000


@dataclass
class RetentionReport:
    finished_deliveries: int = 0
    delivery_attempts: int = 0
    events: int = 0
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
    for statement in (queries.RETENTION_FINISHED, queries.RETENTION_EVENTS):
        while True:
            if time.monotonic() > deadline or not keep_going():
                report.complete = False
                return report
            with conn.transaction():
                cursor = _run(conn, statement, (cutoff, batch))
                if statement is queries.RETENTION_FINISHED:
                    row = cursor.fetchone()
                    removed = int(row[0]) if row else 0
                    report.finished_deliveries += removed
                    report.delivery_attempts += int(row[1]) if row else 0
                else:
                    removed = cursor.rowcount
                    report.events += removed
            report.batches += 1
            if removed < batch:
                break
    return report

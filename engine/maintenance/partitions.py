"""Partitions of the history tables (events, finished_deliveries, delivery_attempts;
schema/026, docs/decisions/0036): daily partitions created some days ahead, and those
wholly older than `retention_days` dropped, a whole day of rows at once with no dead tuple
left behind. An events partition is dropped only once no delivery, queued or finished,
refers to one of its events (partitions_droppable.sql): a destination paused for longer
than the retention keeps the day of its oldest pending delivery's event. Then the
idempotency keys of dropped events go, in bounded batches.

Creating or dropping a partition takes ACCESS EXCLUSIVE on the parent for an instant (on
PostgreSQL 15 and 18 alike): each runs in its own transaction under a short lock_timeout,
and one that gives up waiting is tried again a few times, then left for the next run. The
parent stays usable meanwhile; a query queued behind the waiting DDL waits at most that
long."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import psycopg.errors
from psycopg import Connection

from engine.db import queries
from engine.db.database import repeat_until_short
from engine.db.sql_params import (
    BatchLimitParams,
    LockTimeoutLocalParams,
    PartitionDropParams,
    PartitionsDroppableParams,
    PartitionsEnsureParams,
)
from engine.maintenance.budget import within_budget
from engine.maintenance.retention import cutoff_for

HISTORY_TABLES = ("finished_deliveries", "delivery_attempts", "events")  # events last
# Under deadlock_timeout (1 s) with room: a DDL that waits no longer cannot be picked by
# the deadlock detector over an engine statement (docs/decisions/0028).
LOCK_TIMEOUT = "200ms"
LOCK_ATTEMPTS = 5
LOCK_PAUSE_S = 0.5


@dataclass(frozen=True)
class PartitionSettings:
    retention_days: float
    days_ahead: int = 3
    interval_s: float = 300.0
    budget_s: float = 20.0
    batch: int = 1000


@dataclass
class PartitionReport:
    created: int = 0
    dropped: int = 0
    idempotency_keys: int = 0
    gave_up_waiting: int = 0  # DDL that gave up on its lock_timeout (tried again next run)
    dropped_partitions: list[str] = field(default_factory=list)
    complete: bool = True


def _with_lock_timeout(conn: Connection, work: Callable[[], int]) -> int | None:
    """Run `work` in a transaction under LOCK_TIMEOUT, tried again a few times when the
    timeout fires; None if it never got its lock."""
    for attempt in range(1, LOCK_ATTEMPTS + 1):
        try:
            with conn.transaction():
                queries.LOCK_TIMEOUT_LOCAL.run_sync(
                    conn, LockTimeoutLocalParams(lock_timeout=LOCK_TIMEOUT))
                return work()
        except psycopg.errors.LockNotAvailable:
            time.sleep(attempt * LOCK_PAUSE_S)
    return None


def ensure_ahead(conn: Connection, days_ahead: int) -> int | None:
    """Create the partitions up to `days_ahead` days from now; how many (None: gave up)."""
    def create() -> int:
        row = queries.PARTITIONS_ENSURE.run_sync(
            conn, PartitionsEnsureParams(days_ahead=days_ahead)).fetchone()
        return int(row[0]) if row else 0
    return _with_lock_timeout(conn, create)


def run_partitions(conn: Connection, settings: PartitionSettings,
                   keep_going: Callable[[], bool] = lambda: True) -> PartitionReport:
    report = PartitionReport()
    created = ensure_ahead(conn, settings.days_ahead)
    if created is None:
        report.gave_up_waiting += 1
    else:
        report.created = created
    cutoff = cutoff_for(conn, settings.retention_days)
    for table in HISTORY_TABLES:
        droppable = [row[0] for row in queries.PARTITIONS_DROPPABLE.run_sync(
            conn, PartitionsDroppableParams(cutoff=cutoff, table=table))]
        for partition in droppable:
            if not keep_going():
                report.complete = False
                return report

            def drop(partition: str = partition) -> int:
                queries.PARTITION_DROP.run_sync(conn, PartitionDropParams(partition=partition))
                return 1

            if _with_lock_timeout(conn, drop) is None:
                report.gave_up_waiting += 1
                report.complete = False
            else:
                report.dropped += 1
                report.dropped_partitions.append(partition)

    def keys_batch() -> int:
        with conn.transaction():
            removed = queries.IDEMPOTENCY_KEYS_EXPIRE.run_sync(
                conn, BatchLimitParams(batch_limit=settings.batch)).rowcount
        report.idempotency_keys += removed
        return removed

    if not repeat_until_short(keys_batch, settings.batch,
                              within_budget(settings.budget_s, keep_going))[1]:
        report.complete = False
    return report


def run_once(conn: Connection, settings: PartitionSettings,
             keep_going: Callable[[], bool]) -> PartitionReport:
    return run_partitions(conn, settings, keep_going)

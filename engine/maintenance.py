"""The maintenance process: one leader per cluster runs the housekeeping jobs.

Every host may run one; the holder of the leader lock (engine/leader.py) does the work and
the others poll to take over. Jobs, each in bounded batches of short transactions:
- reaper: claims whose lease ran out (a lost host) go back to pending;
- retention: finished deliveries, their attempts and then unreferenced events older than
  `retention_days` are deleted;
- breaker_defer: due deliveries of destinations whose breaker is open move to the end of
  the pause, out of the claim's way (engine/sql/breaker_defer.sql);
- auto_disable: destinations whose attempts have all failed for `disable_after` are
  disabled, with an operational event (engine/sql/auto_disable.sql);
- fold_minutes: the console's per-minute rollup rows of each worker are folded into one
  per minute and destination (engine/sql/fold_delivery_minutes.sql).
Each job run that did something logs one JSON line to stderr; so do leadership changes.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import psycopg

from engine import queries, queue
from engine.config import Settings
from engine.leader import Leadership
from engine.oplog import Outage, log_event
from engine.queue import _run
from engine.retention import run_retention

TICK_S = 1.0
REAPER_INTERVAL_S = 5.0
BREAKER_DEFER_INTERVAL_S = 2.0
BREAKER_DEFER_BATCH = 1000
BREAKER_DEFER_BUDGET_S = 5.0
RETENTION_INTERVAL_S = 300.0
# Often enough that a short disable_after (tests, demos) is honoured within seconds; the
# statement reads only the small destinations table.
AUTO_DISABLE_INTERVAL_S = 2.0
RETENTION_BUDGET_S = 20.0
# A minute's rows are folded once it is two minutes old; every 15 s keeps the unfolded
# rows to about three minutes' worth per worker and destination.
FOLD_MINUTES_INTERVAL_S = 15.0
FOLD_MINUTES_BATCH = 5000
FOLD_MINUTES_BUDGET_S = 5.0

class Job:
    def __init__(self, name: str, interval_s: float,
                 run: Callable[[psycopg.Connection], dict[str, Any]]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.run = run
        self.next_at = 0.0  # run at once on becoming leader


def _jobs(settings: Settings, leadership: Leadership) -> list[Job]:
    def reaper(conn: psycopg.Connection) -> dict[str, Any]:
        return {"returned": queue.reap_expired(conn, settings.max_attempts)}

    def retention(conn: psycopg.Connection) -> dict[str, Any]:
        report = run_retention(
            conn, settings.retention_days, budget_s=RETENTION_BUDGET_S,
            keep_going=leadership.heartbeat,
        )
        return asdict(report) | {"retention_days": settings.retention_days}

    def breaker_defer(conn: psycopg.Connection) -> dict[str, Any]:
        return {"deferred": defer_open_breakers(conn, keep_going=leadership.heartbeat)}

    def auto_disable(conn: psycopg.Connection) -> dict[str, Any]:
        with conn.transaction():
            row = _run(conn, queries.AUTO_DISABLE, (settings.disable_after_s,)).fetchone()
        assert row is not None
        return {"disabled": int(row[0]), "operational_events": int(row[1])}

    def fold_minutes(conn: psycopg.Connection) -> dict[str, Any]:
        return {"folded": fold_delivery_minutes(conn, keep_going=leadership.heartbeat)}

    return [Job("reaper", REAPER_INTERVAL_S, reaper),
            Job("auto_disable", AUTO_DISABLE_INTERVAL_S, auto_disable),
            Job("breaker_defer", BREAKER_DEFER_INTERVAL_S, breaker_defer),
            Job("fold_minutes", FOLD_MINUTES_INTERVAL_S, fold_minutes),
            Job("retention", RETENTION_INTERVAL_S, retention)]


def defer_open_breakers(
    conn: psycopg.Connection, batch: int = BREAKER_DEFER_BATCH,
    budget_s: float = BREAKER_DEFER_BUDGET_S, keep_going: Callable[[], bool] = lambda: True,
) -> int:
    """Move due deliveries of open-breaker destinations to the end of their pause, a
    batch per short transaction, for at most `budget_s`."""
    total = 0
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline and keep_going():
        with conn.transaction():
            moved = _run(conn, queries.BREAKER_DEFER, (batch,)).rowcount
        total += moved
        if moved < batch:
            break
    return total


def fold_delivery_minutes(
    conn: psycopg.Connection, batch: int = FOLD_MINUTES_BATCH,
    budget_s: float = FOLD_MINUTES_BUDGET_S, keep_going: Callable[[], bool] = lambda: True,
) -> int:
    """Fold the per-writer delivery_minutes rows of finished minutes, a batch per short
    transaction, for at most `budget_s`; returns the rows folded away."""
    total = 0
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline and keep_going():
        with conn.transaction():
            row = _run(conn, queries.FOLD_DELIVERY_MINUTES, (batch,)).fetchone()
        folded = int(row[0]) if row else 0
        total += folded
        if folded < batch:
            break
    return total


def _did_something(outcome: dict[str, Any]) -> bool:
    return any(isinstance(v, int) and not isinstance(v, bool) and v > 0
               for k, v in outcome.items() if k != "batches")


def run_maintenance(settings: Settings, dsn: str,
                    stop: threading.Event | None = None) -> None:
    """Run until `stop` is set (or SIGTERM/SIGINT when run as a process's main thread)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    leadership = Leadership(dsn)
    jobs = _jobs(settings, leadership)
    work_conn: psycopg.Connection | None = None
    # Once a second during an outage: two log lines for all of it, not one per tick.
    outage = Outage("maintenance")
    standing_by = False  # the last attempt found another process leading
    try:
        while not stop.is_set():
            was_leader = leadership.held
            try:
                leader = leadership.try_acquire()
            except psycopg.Error as exc:
                outage.failed(exc, "leader lock")
                leader = False
            else:
                outage.recovered()
                if not leader and not standing_by:
                    # Once per stretch of following, so an operator (or a test) can tell a
                    # follower from a process that has not tried yet.
                    log_event("leader_standby", role="maintenance")
                standing_by = not leader
            if leader and not was_leader:
                log_event("leader_acquired", role="maintenance")
                for job in jobs:
                    job.next_at = 0.0
            elif was_leader and not leader:
                log_event("leader_lost", role="maintenance")
            if leader:
                work_conn = _run_due_jobs(jobs, dsn, work_conn, stop)
            stop.wait(TICK_S)
    finally:
        if work_conn is not None:
            work_conn.close()
        if leadership.held:
            log_event("leader_released", role="maintenance")
        leadership.release()


def _run_due_jobs(jobs: list[Job], dsn: str, conn: psycopg.Connection | None,
                  stop: threading.Event) -> psycopg.Connection | None:
    for job in jobs:
        if stop.is_set() or time.monotonic() < job.next_at:
            continue
        job.next_at = time.monotonic() + job.interval_s
        started = time.monotonic()
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(dsn, autocommit=True, connect_timeout=5,
                                       application_name="engine maintenance")
            outcome = job.run(conn)
        except psycopg.Error as exc:
            log_event("maintenance_job_failed", job=job.name, error=str(exc))
            if conn is not None:
                conn.close()
            conn = None
            continue
        if _did_something(outcome):
            took_ms = round((time.monotonic() - started) * 1000, 1)
            log_event("maintenance_job", job=job.name, ms=took_ms, **outcome)
    return conn

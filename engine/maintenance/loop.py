"""The maintenance loop: take (or keep) the leader lock every tick and, while leading,
run each job (engine/maintenance/*.py) when its interval has passed."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from typing import Any

import psycopg

from engine.config import Settings
from engine.maintenance import (
    auto_disable,
    breaker_defer,
    fold_minutes,
    partitions,
    payload_retention,
    reaper,
    retention,
    stalled_claims,
)
from engine.maintenance.leader import Leadership
from engine.observe.oplog import Outage, log_event

TICK_S = 1.0


class Job:
    def __init__(self, name: str, interval_s: float,
                 run: Callable[[psycopg.Connection], Any]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.run = run  # run_once with its settings: returns a report dataclass
        self.next_at = 0.0  # run at once on becoming leader


def _jobs(settings: Settings, leadership: Leadership) -> list[Job]:
    reaping = reaper.ReaperSettings(settings.max_attempts)
    disabling = auto_disable.AutoDisableSettings(settings.disable_after_s)
    deferring = breaker_defer.BreakerDeferSettings()
    retaining = retention.RetentionSettings(settings.retention_days)
    partitioning = partitions.PartitionSettings(settings.retention_days)
    clearing = payload_retention.PayloadRetentionSettings(settings.payload_days)
    folding = fold_minutes.FoldMinutesSettings()
    unstalling = stalled_claims.StalledClaimsSettings()
    return [
        Job("reaper", reaping.interval_s, partial(reaper.run_once, settings=reaping)),
        Job("stalled_claims", unstalling.interval_s,
            partial(stalled_claims.run_once, settings=unstalling)),
        Job("auto_disable", disabling.interval_s,
            partial(auto_disable.run_once, settings=disabling)),
        Job("breaker_defer", deferring.interval_s, partial(
            breaker_defer.run_once, settings=deferring, keep_going=leadership.heartbeat)),
        Job("fold_minutes", folding.interval_s, partial(
            fold_minutes.run_once, settings=folding, keep_going=leadership.heartbeat)),
        Job("partitions", partitioning.interval_s, partial(
            partitions.run_once, settings=partitioning, keep_going=leadership.heartbeat)),
        Job("payload_retention", clearing.interval_s, partial(
            payload_retention.run_once, settings=clearing, keep_going=leadership.heartbeat)),
        Job("retention", retaining.interval_s, partial(
            retention.run_once, settings=retaining, keep_going=leadership.heartbeat)),
    ]


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
            outcome = asdict(job.run(conn))
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

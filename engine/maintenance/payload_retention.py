"""Payload retention (SPEC, "History and retention"): event payloads and attempts'
response bodies older than `payload_retention_days` are cleared, the rest of the history
(types, times, statuses, errors) kept until its partition is dropped (partitions.py).

The job walks each partition of events and delivery_attempts wholly older than the cutoff
by id, a bounded batch per short transaction, from the cursor it keeps in payload_sweeps
(schema/026), so a run goes on where the last one stopped. Whole partitions only: a
payload is cleared between payload_retention_days and a day later. An event a queued
delivery still needs keeps its payload (the claim sends it); a pass that left one behind
starts the partition over on the next run, until a pass leaves nothing, after which the
partition is done. An UPDATE leaves a dead tuple per row: the sweep is a one-off per
partition, which vacuum then cleans, where deleting rows was the whole history's churn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from psycopg import Connection

from engine.db import queries
from engine.db.sql_params import (
    PayloadSweepParams,
    PayloadSweepsReadParams,
    PayloadSweepsSaveParams,
)
from engine.maintenance.budget import within_budget
from engine.maintenance.retention import cutoff_for


@dataclass(frozen=True)
class PayloadRetentionSettings:
    payload_retention_days: float
    interval_s: float = 300.0
    budget_s: float = 20.0
    batch: int = 1000


@dataclass
class PayloadRetentionReport:
    payloads: int = 0  # event payloads cleared
    response_bodies: int = 0
    kept: int = 0  # payloads left because a queued delivery needs them (or a lock)
    partitions_done: int = 0
    batches: int = 0
    complete: bool = True


def run_payload_retention(conn: Connection, settings: PayloadRetentionSettings,
                          keep_going: Callable[[], bool] = lambda: True
                          ) -> PayloadRetentionReport:
    report = PayloadRetentionReport()
    in_budget = within_budget(settings.budget_s, keep_going)
    cutoff = cutoff_for(conn, settings.payload_retention_days)
    sweeps = queries.PAYLOAD_SWEEPS_READ.run_sync(
        conn, PayloadSweepsReadParams(cutoff=cutoff)).fetchall()
    for parent, partition, lower, upper, after_id, left_some in sweeps:
        statement = (queries.PAYLOAD_SWEEP_EVENTS if parent == "events"
                     else queries.PAYLOAD_SWEEP_ATTEMPTS)
        while True:
            if not in_budget():
                report.complete = False
                return report
            with conn.transaction():
                row = statement.run_sync(conn, PayloadSweepParams(
                    lower=lower, upper=upper, after_id=after_id,
                    batch_limit=settings.batch)).fetchone()
                assert row is not None
                last_id, walked, cleared, kept = row
                if parent == "events":
                    report.payloads += cleared
                else:
                    report.response_bodies += cleared
                report.kept += kept
                report.batches += 1
                left_some = left_some or kept > 0
                finished = walked < settings.batch
                if finished:
                    # A pass that left some starts over next run; one that left none is done.
                    queries.PAYLOAD_SWEEPS_SAVE.run_sync(conn, PayloadSweepsSaveParams(
                        partition=partition, after_id=0, left_some=False,
                        complete=not left_some))
                else:
                    after_id = int(last_id)
                    queries.PAYLOAD_SWEEPS_SAVE.run_sync(conn, PayloadSweepsSaveParams(
                        partition=partition, after_id=after_id, left_some=left_some,
                        complete=False))
            if finished:
                if not left_some:
                    report.partitions_done += 1
                break
    return report


def run_once(conn: Connection, settings: PayloadRetentionSettings,
             keep_going: Callable[[], bool]) -> PayloadRetentionReport:
    return run_payload_retention(conn, settings, keep_going)

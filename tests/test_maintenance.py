"""Maintenance: retention removes exactly what is old; the leader fails over when killed;
the reaper runs under the leader."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from engine.db import queries, queue_async
from engine.db.queue import EventIn, Result
from engine.db.sql_params import RetentionBatchParams, TenantDeliveryParams
from engine.maintenance.retention import cutoff_for, run_retention
from tests.kit import queue_sync
from tests.kit.data import LEASE_MS, add_destination, now, statuses

REPO = Path(__file__).resolve().parents[1]
ENGINE = [sys.executable, "-c", "from engine.cli import main; raise SystemExit(main())"]


def test_retention_removes_exactly_what_is_old(conn: psycopg.Connection) -> None:
    dest = add_destination(conn)
    with conn.transaction():
        events = [e for e, _ in queue_sync.enqueue_events(
            conn, [EventIn("t", str(i), [dest]) for i in range(12)])]
    with conn.transaction():
        nobody = queue_sync.enqueue_events(conn, [EventIn("t", "x", [])])[0][0]  # no delivery
    claims = {c.event_id: c for c in queue_sync.claim_batch(conn, "w", 10, LEASE_MS)}
    t = now(conn)
    # events[0:10] finish (delivered, or dead after one attempt each), 10 and 11 stay queued.
    queue_sync.record_results(conn, "w", [
        Result(claims[e].id, 1, "delivered" if i % 2 else "dead", t, 3, 200)
        for i, e in enumerate(events[:10])
    ])
    old_finished = events[:7]  # completed long ago
    old_event_recent_finish = events[7]  # event old, delivery finished recently: kept
    conn.execute("UPDATE events SET created_at = now() - interval '40 days'"
                 " WHERE id = ANY(%s)", [[*events[:8], events[10], nobody]])
    conn.execute("UPDATE finished_deliveries SET completed_at = now() - interval '31 days'"
                 " WHERE event_id = ANY(%s)", [old_finished])
    delivery_of = dict(conn.execute(
        "SELECT event_id, id FROM finished_deliveries").fetchall())

    report = run_retention(conn, retention_days=30, batch=3)

    assert (report.finished_deliveries, report.delivery_attempts) == (7, 7)
    assert report.events == 7 + 1 and report.complete
    # Batches of at most 3: 3+3+1 finished, 3+3+2 events, then one of delivery_minutes,
    # which holds nothing old (the rollup's rows are of this minute).
    assert report.batches == 3 + 3 + 1 and report.delivery_minutes == 0
    left_events = {r[0] for r in conn.execute("SELECT id FROM events").fetchall()}
    assert left_events == set(events[7:])
    left_finished = {r[0] for r in conn.execute(
        "SELECT event_id FROM finished_deliveries").fetchall()}
    assert left_finished == {old_event_recent_finish, events[8], events[9]}
    left_attempts = {r[0] for r in conn.execute(
        "SELECT delivery_id FROM delivery_attempts").fetchall()}
    assert left_attempts == {delivery_of[e] for e in left_finished}
    # The queued old event (events[10]) keeps its delivery and its row.
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone() == (2,)


def deliveries_without_event(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM deliveries d"
        "         WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = d.event_id))"
        "     + (SELECT count(*) FROM finished_deliveries f"
        "         WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = f.event_id))"
    ).fetchone()
    assert row is not None
    return int(row[0])


def wait_for_lock_wait(conn: psycopg.Connection, backend_pid: int) -> None:
    deadline = time.monotonic() + 10
    while conn.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [backend_pid]
    ).fetchone() != ("Lock",):
        assert time.monotonic() < deadline, "the replay never waited for the lock"
        time.sleep(0.02)


@pytest.mark.pg_versions
def test_retention_interleaved_with_moves_keeps_every_delivery_event(
    dsn: str, conn: psycopg.Connection
) -> None:
    """No foreign key and no lock keep retention from deleting an event while one of its
    deliveries moves between the tables: only the snapshot of retention_events' single
    statement does (see engine/sql/maintenance/retention_events.sql). Each move here is caught half
    way, committed on one connection while retention runs on another."""
    dest = add_destination(conn)
    with conn.transaction():
        replayed, completed, expired = [e for e, _ in queue_sync.enqueue_events(
            conn, [EventIn("t", str(i), [dest]) for i in range(3)])]
    conn.execute("UPDATE events SET created_at = now() - interval '40 days'")
    claims = {c.event_id: c for c in queue_sync.claim_batch(conn, "w", 3, LEASE_MS)}
    t = now(conn)
    queue_sync.record_results(conn, "w", [
        Result(claims[e].id, 1, "dead", t, error="refused") for e in (replayed, expired)
    ])
    aged = "UPDATE finished_deliveries SET completed_at = now() - interval '31 days' WHERE id = %s"
    conn.execute(aged, [claims[expired].id])

    with psycopg.connect(dsn, autocommit=True) as mover, \
            psycopg.connect(dsn, autocommit=True) as retention:
        # Retention has deleted `expired`'s old finished delivery, not committed yet: a
        # replay of it waits for the row, then finds nothing to move.
        replaying = queue_sync.backend_pid(mover)  # the replay's session (its twin)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            with retention.transaction():
                row = queries.RETENTION_FINISHED.run_sync(retention, RetentionBatchParams(
                    cutoff=cutoff_for(retention, 30), batch_limit=1)).fetchone()
                assert row is not None and row[0] == 1
                replay = pool.submit(queue_sync.replay_delivery, mover, claims[expired].id)
                wait_for_lock_wait(conn, replaying)
            assert replay.result(10) is False

        conn.execute(aged, [claims[replayed].id])
        # A replay moves `replayed`'s (old) finished delivery back to the queue and a
        # completion moves `completed`'s to finished_deliveries; while neither has
        # committed, retention sees their old rows and keeps both events.
        with mover.transaction():
            assert queries.REPLAY_DELIVERY.run_sync(
                mover, TenantDeliveryParams(delivery_id=claims[replayed].id, tenant_id=1),
            ).fetchone()
            delivered = Result(claims[completed].id, 1, "delivered", t, 3, 200)
            row = queries.RECORD_RESULTS.run_sync(
                mover, queue_async.record_params("w", [delivered])).fetchone()
            assert row is not None and row[0] == 1
            during = run_retention(retention, retention_days=30)
        after = run_retention(retention, retention_days=30)

    assert (during.finished_deliveries, during.events) == (0, 1)  # `expired`'s event
    assert (after.finished_deliveries, after.events) == (0, 0)
    left = {r[0] for r in conn.execute("SELECT id FROM events").fetchall()}
    assert left == {replayed, completed}
    assert deliveries_without_event(conn) == 0
    assert statuses(conn) == {claims[replayed].id: "pending",
                              claims[completed].id: "delivered"}


class Proc:
    """A maintenance process whose stderr JSON lines are collected as they come."""

    def __init__(self, dsn: str, config: Path) -> None:
        self.lines: list[dict] = []
        self.popen = subprocess.Popen(
            [*ENGINE, "maintenance", "--dsn", dsn, "--config", str(config)],
            cwd=REPO, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.lines.append({"raw": line})

    def events(self, name: str) -> int:
        return sum(1 for line in self.lines if line.get("event") == name)

    def wait_for(self, name: str, timeout: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.events(name):
                return time.monotonic() - started
            time.sleep(0.05)
        raise AssertionError(f"no {name} within {timeout}s: {self.lines}")


@contextmanager
def maintenance_procs(dsn: str, tmp_path: Path, count: int) -> Iterator[list[Proc]]:
    config = tmp_path / "engine.toml"
    config.write_text("retention_days = 30\n")
    procs = [Proc(dsn, config) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.popen.wait(10)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()


def test_leader_fails_over_when_killed(dsn: str, conn: psycopg.Connection,
                                       tmp_path: Path) -> None:
    with maintenance_procs(dsn, tmp_path, 1) as (first,):
        first.wait_for("leader_acquired", 30)
        with maintenance_procs(dsn, tmp_path, 1) as (second,):
            second.wait_for("leader_standby", 30)  # its first try found the lock taken
            assert second.popen.poll() is None and second.events("leader_acquired") == 0
            # An expired claim is reaped by the leader.
            add_destination(conn)
            with conn.transaction():
                queue_sync.enqueue_events(conn, [EventIn("t", "{}")])
            queue_sync.claim_batch(conn, "lost-host:1", 1, 1)
            first.popen.send_signal(signal.SIGKILL)
            first.popen.wait(10)
            second.wait_for("leader_acquired", 15)
            deadline = time.monotonic() + 15
            while conn.execute("SELECT count(*) FROM deliveries WHERE status = 'pending'"
                               ).fetchone() != (1,):
                assert time.monotonic() < deadline, second.lines
                time.sleep(0.1)
            assert any(line.get("job") == "reaper" and line.get("returned") == 1
                       for line in second.lines)
            holders = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND objsubid = 1").fetchone()
            assert holders == (1,)
        assert second.popen.returncode == 0
        assert second.events("leader_released") == 1

"""Maintenance: the leader fails over when killed; the reaper runs under the leader.
(Retention of the history tables: tests/test_history_partitions.py.)"""

from __future__ import annotations

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

from engine.db.queue import EventIn
from tests.kit import queue_sync
from tests.kit.data import add_destination

REPO = Path(__file__).resolve().parents[1]
ENGINE = [sys.executable, "-c", "from engine.cli import main; raise SystemExit(main())"]


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

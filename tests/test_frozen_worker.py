"""A worker frozen (SIGSTOP) inside its claim transaction: that transaction ends within a
short bound, the other worker delivers the work meanwhile, and the resumed worker
reconnects and goes on without sending anything twice.

Deterministic up to one point: the test holds an exclusive lock on `destinations` while
it enqueues, so every worker's next claim waits inside its transaction, on the lock
(pg_stat_activity shows it); the test stops one of them there, then lets the lock go. The
stopped worker's statement completes, and its session waits for a client that sends
nothing more, which is the state the issue saw for 96 s. Which of two states that is
depends on where in its pipelined claim the worker stopped: `idle in transaction` when
its Sync had gone out (the server's idle_in_transaction_session_timeout ends it), or
`active`, waiting on ClientRead, when it stopped between two sends (the maintenance
leader ends it: engine/sql/maintenance/end_stalled_claims.sql). Both are bounded alike; the second
is also shown alone, exactly, in tests/test_stalled_claims.py."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import psycopg
import pytest

from engine.db.database import IDLE_IN_TRANSACTION_TIMEOUT_MS
from engine.db.queue import EventIn
from tests.kit import queue_sync
from tests.kit.data import add_destination
from tests.kit.enginerun import Engine, wait_until
from tests.kit.hostile_servers import HostileServer

pytestmark = pytest.mark.pg_versions

EVENTS = 50


def claim_session(conn: psycopg.Connection, pid: int) -> tuple[str, str | None] | None:
    """(state, wait_event_type) of the worker's session that is inside a transaction."""
    row = conn.execute(
        "SELECT state, wait_event_type FROM pg_stat_activity WHERE application_name = %s"
        " AND xact_start IS NOT NULL", [f"engine worker {socket.gethostname()}:{pid}"]
    ).fetchone()
    return None if row is None else (row[0], row[1])


def delivered(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM finished_deliveries WHERE status = 'delivered'"
                       ).fetchone()
    return int(row[0]) if row else 0


def test_worker_frozen_in_its_claim_transaction(
    dsn: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    with HostileServer() as server, Engine(
        dsn, tmp_path, "--procs", "2", "--bind", "127.0.0.1:0", "--allow-private-targets",
    ) as engine:
        add_destination(conn, url=server.url("healthy"))
        wait_until(lambda: len(engine.events("child_started")) >= 4, 60, "children")
        frozen, other = engine.worker_pids()
        with psycopg.connect(dsn) as locker:  # not autocommit: one transaction
            locker.execute("LOCK TABLE destinations IN ACCESS EXCLUSIVE MODE")
            queue_sync.enqueue_events(locker, [EventIn("t", f'{{"n":{i}}}') for i in range(EVENTS)])
            wait_until(lambda: claim_session(conn, frozen) == ("active", "Lock"), 30,
                       "the worker's claim waiting on the lock")
            os.kill(frozen, signal.SIGSTOP)
            try:
                locker.commit()
                seen: list[tuple[str, str] | None] = []

                def claim_left_open() -> bool:
                    seen.append(claim_session(conn, frozen))
                    return seen[-1] is not None and (
                        seen[-1][0] == "idle in transaction" or seen[-1] == ("active", "Client"))

                # A guard, not a timing bound: the first statement has only to finish.
                try:
                    wait_until(claim_left_open, 60, "the frozen claim left open")
                except AssertionError as error:
                    raise AssertionError(f"{error}; its session was {set(seen)}") from None
                left_open = time.monotonic()
                left_state = seen[-1]
                # Nobody is left to end it but the server or the maintenance leader.
                wait_until(lambda: claim_session(conn, frozen) is None,
                           IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000 + 10, "its end")
                closed_after = time.monotonic() - left_open
                wait_until(lambda: delivered(conn) == EVENTS, 60, "the other worker's work")
            finally:
                os.kill(frozen, signal.SIGCONT)
        queue_sync.enqueue_events(conn, [EventIn("t", f'{{"m":{i}}}') for i in range(EVENTS)])
        wait_until(lambda: delivered(conn) == 2 * EVENTS, 60, "deliveries after the thaw")
        # The thawed worker found its session gone and reconnected: it is still the same
        # process, and it claims again.
        wait_until(lambda: [r for r in engine.events("database_unavailable")
                            if r["pid"] == frozen and r["during"] == "claim"], 30,
                   "the reconnect")
        engine.assert_no_worker_exited()
        assert engine.worker_pids() == [frozen, other]
        assert not engine.events("child_exited")
    assert sorted(server.healthy_ids.values()) == [1] * (2 * EVENTS)  # no duplicate
    # The leader looks once a second (engine/maintenance/stalled_claims.py).
    assert closed_after <= IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000 + 3, (closed_after, left_state)
    print(f"frozen claim transaction {left_state} ended {closed_after:.1f} s after it"
          f" was left open")

"""The maintenance job that ends worker sessions stalled in the middle of a pipelined
transaction (engine/sql/maintenance/end_stalled_claims.sql), shown exactly: a real session is put in
each state by hand, with the same pipelining the claim uses, and only the stalled worker
session is ended, which frees the row it had locked."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import psycopg
import pytest

from engine.maintenance.stalled_claims import end_stalled_claims
from tests.kit.data import add_destination
from tests.kit.enginerun import wait_until

# On PostgreSQL 15 as well: before 17, no server setting ends this state at all.
pytestmark = pytest.mark.pg_versions

STALLED_AFTER_MS = 200
WORKER_NAME = "engine worker test-host:4242"


def session_state(conn: psycopg.Connection, pid: int) -> tuple[str, str | None] | None:
    row = conn.execute("SELECT state, wait_event FROM pg_stat_activity WHERE pid = %s",
                       [pid]).fetchone()
    return None if row is None else (row[0], row[1])


@contextlib.contextmanager
def stalled_mid_pipeline(dsn: str, name: str, destination: int) -> Iterator[int]:
    """A session that began a pipelined transaction, locked the destination's row and sent
    nothing more (no Sync), as a worker frozen between two sends of its claim leaves it.
    Yields its backend pid once the server waits for it."""
    conn = psycopg.connect(dsn, autocommit=True, application_name=name)
    try:
        pid = conn.info.backend_pid
        with contextlib.suppress(psycopg.OperationalError), conn.pipeline():
            conn.execute("BEGIN")
            conn.execute("SELECT id FROM destinations WHERE id = %s FOR UPDATE", [destination])
            # execute() in a pipeline sends at once and returns without waiting: the
            # server runs both, then waits for the next message.
            yield pid
    finally:
        conn.close()


def row_free(conn: psycopg.Connection, destination: int) -> bool:
    try:
        with conn.transaction():
            conn.execute("SELECT id FROM destinations WHERE id = %s FOR UPDATE NOWAIT",
                         [destination])
    except psycopg.errors.LockNotAvailable:
        return False
    return True


def test_a_worker_stalled_mid_claim_is_ended_and_its_lock_freed(
    dsn: str, conn: psycopg.Connection
) -> None:
    destination = add_destination(conn)
    with stalled_mid_pipeline(dsn, WORKER_NAME, destination) as pid:
        wait_until(lambda: session_state(conn, pid) == ("active", "ClientRead"), 30,
                   "the session waiting for its client mid-transaction")
        assert not row_free(conn, destination)
        # Not before the bound.
        assert end_stalled_claims(conn, 60_000) == []
        time.sleep(STALLED_AFTER_MS / 1000 * 2)
        assert end_stalled_claims(conn, STALLED_AFTER_MS) == [pid]
        wait_until(lambda: session_state(conn, pid) is None, 30, "the session gone")
        assert row_free(conn, destination)


@pytest.mark.parametrize("name", ["engine ingress", "psql"])
def test_other_sessions_in_that_state_are_left_alone(
    dsn: str, conn: psycopg.Connection, name: str
) -> None:
    """Only worker sessions: an operator's session (or another engine role) mid-pipeline
    is not the maintenance job's to end."""
    destination = add_destination(conn)
    with stalled_mid_pipeline(dsn, name, destination) as pid:
        wait_until(lambda: session_state(conn, pid) == ("active", "ClientRead"), 30,
                   "the session waiting for its client mid-transaction")
        time.sleep(STALLED_AFTER_MS / 1000 * 2)
        assert end_stalled_claims(conn, STALLED_AFTER_MS) == []
        assert session_state(conn, pid) == ("active", "ClientRead")


def test_idle_and_lock_waiting_worker_sessions_are_left_alone(
    dsn: str, conn: psycopg.Connection
) -> None:
    """`idle in transaction` is the server's timeout's to end, and a claim waiting on a
    lock is working, however long it waits."""
    destination = add_destination(conn)
    with psycopg.connect(dsn, application_name=WORKER_NAME) as idle, \
            psycopg.connect(dsn, application_name=WORKER_NAME) as waiting:
        idle.execute("SELECT id FROM destinations WHERE id = %s FOR UPDATE", [destination])
        with stalled_waiting(waiting, destination) as waiting_pid:
            wait_until(lambda: session_state(conn, waiting_pid) == ("active", "transactionid"),
                       30, "the second session waiting on the first one's row lock")
            assert session_state(conn, idle.info.backend_pid) == (
                "idle in transaction", "ClientRead")
            time.sleep(STALLED_AFTER_MS / 1000 * 2)
            assert end_stalled_claims(conn, STALLED_AFTER_MS) == []
            idle.rollback()


@contextlib.contextmanager
def stalled_waiting(conn: psycopg.Connection, destination: int) -> Iterator[int]:
    """`conn` sends a statement that waits on the row lock; yields its pid. The statement
    completes once the lock is released (before the block ends)."""
    pid = conn.info.backend_pid
    with conn.pipeline() as pipeline:
        conn.execute("SELECT id FROM destinations WHERE id = %s FOR UPDATE", [destination])
        yield pid
        pipeline.sync()
    conn.rollback()

"""A batch the server acknowledged and a crash undid is written again on the recorder's
next connection (engine/worker/recorder.py, UNFLUSHED_S; decision 0037: worker sessions
commit without waiting for the disk).

A real crash undoes such a commit only when it comes before the WAL writer's flush, which
no test can time. The undo is made by hand instead, exactly as recovery leaves it: the
deliveries back in flight under the same worker, attempt and claim token, and none of the
batch's history. The recorder's connection is then ended by the server
(pg_terminate_backend), as a restart ends it, and the claim loop's check (as after its
own reconnect) has the writer look at it with nothing new to write.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import psycopg
import pytest

from engine.db import queue_async
from engine.domain import BreakerSettings, Result
from engine.observe.oplog import Outage
from engine.worker.connection import DrainDeadline, connect
from engine.worker.recorder import UNFLUSHED_S, ResultRecorder
from tests.kit.data import LEASE_MS, add_destination, count, enqueue
from tests.kit.worker_path import answer

pytestmark = pytest.mark.pg_versions

WORKER = "test:rewrite"
BREAKER = BreakerSettings(threshold=1_000_000)
EVENTS = 6


def undo_as_a_crash_would(conn: psycopg.Connection, snapshot: str, ids: list[int]) -> None:
    """The deliveries as they were when claimed, and nothing the batch wrote."""
    with conn.transaction():
        conn.execute("DELETE FROM finished_deliveries WHERE id = ANY (%s)", [ids])
        conn.execute("DELETE FROM delivery_attempts WHERE delivery_id = ANY (%s)", [ids])
        conn.execute("DELETE FROM deliveries WHERE id = ANY (%s)", [ids])
        conn.execute(f"INSERT INTO deliveries SELECT * FROM {snapshot}")


def run_scenario(dsn: str, conn: psycopg.Connection, *, age_s: float) -> list[int]:
    """Claim, record through a ResultRecorder, undo the batch, end the recorder's
    connection and ask for a check: the ids of the deliveries claimed. `age_s`: how long
    ago the batch counts as acknowledged when the check comes."""
    destination = add_destination(conn, url="http://127.0.0.1:9/rewrite")
    enqueue(conn, [f'{{"n":{n}}}' for n in range(EVENTS)], [destination])

    async def scenario() -> list[int]:
        outage = Outage("worker", worker=WORKER)
        claim_conn = await connect(dsn, WORKER, listen=False, outage=outage,
                                   give_up=lambda: None)
        claims = await queue_async.claim_batch(claim_conn, WORKER, EVENTS, LEASE_MS, 0, [])
        await claim_conn.close()
        ids = [claim.id for claim in claims]
        assert len(ids) == EVENTS
        conn.execute("CREATE TEMP TABLE claimed AS SELECT * FROM deliveries"
                     " WHERE id = ANY (%s)", [ids])

        recorder = ResultRecorder(dsn, WORKER, BREAKER, LEASE_MS, outage, DrainDeadline())
        await recorder.open()
        started = dt.datetime.now(dt.UTC)
        results: list[Result] = [answer(claim, 200, started, ()) for claim in claims]
        for result in results:
            recorder.add(result)
        batch = await recorder.next_batch()
        assert batch is not None
        await recorder.write(batch, {})
        assert count(conn, "SELECT count(*) FROM deliveries WHERE id = ANY (%s)", ids) == 0

        undo_as_a_crash_would(conn, "claimed", ids)
        when, written = recorder.recent[-1]
        recorder.recent[-1] = (when - age_s, written)
        backend = recorder.conn.info.backend_pid
        conn.execute("SELECT pg_terminate_backend(%s)", [backend])
        for _ in range(100):  # the server's goodbye reaches the socket
            if recorder.conn.closed or recorder.conn.broken:
                break
            await asyncio.sleep(0.01)
        recorder.check_connection()
        check = await recorder.next_batch()
        assert check is not None and check.results == []
        await recorder.write(check, {})
        assert recorder.conn.info.backend_pid != backend
        await recorder.conn.close()
        return ids

    return asyncio.run(scenario())


def test_a_batch_a_crash_undid_is_written_again(dsn: str, conn: psycopg.Connection) -> None:
    ids = run_scenario(dsn, conn, age_s=0.0)
    assert count(conn, "SELECT count(*) FROM deliveries WHERE id = ANY (%s)", ids) == 0
    assert count(conn, "SELECT count(*) FROM finished_deliveries"
                       " WHERE id = ANY (%s) AND status = 'delivered'", ids) == EVENTS
    # One attempt each: the write applied once, not on top of a history it still had.
    assert count(conn, "SELECT count(*) FROM delivery_attempts"
                       " WHERE delivery_id = ANY (%s)", ids) == EVENTS


def test_a_batch_older_than_the_flush_bound_is_left_to_the_lease(
    dsn: str, conn: psycopg.Connection
) -> None:
    ids = run_scenario(dsn, conn, age_s=UNFLUSHED_S + 1.0)
    assert count(conn, "SELECT count(*) FROM deliveries WHERE id = ANY (%s)"
                       " AND status = 'in_flight' AND locked_by = %s", ids, WORKER) == EVENTS


def test_a_batch_that_was_kept_is_not_applied_twice(dsn: str, conn: psycopg.Connection) -> None:
    """Written again with nothing undone: the guard leaves every row and history as it
    was (the claim tokens are gone with the rows)."""
    destination = add_destination(conn, url="http://127.0.0.1:9/kept")
    enqueue(conn, [f'{{"n":{n}}}' for n in range(EVENTS)], [destination])

    async def scenario() -> list[int]:
        outage = Outage("worker", worker=WORKER)
        claim_conn = await connect(dsn, WORKER, listen=False, outage=outage,
                                   give_up=lambda: None)
        claims = await queue_async.claim_batch(claim_conn, WORKER, EVENTS, LEASE_MS, 0, [])
        await claim_conn.close()
        recorder = ResultRecorder(dsn, WORKER, BREAKER, LEASE_MS, outage, DrainDeadline())
        await recorder.open()
        started = dt.datetime.now(dt.UTC)
        for claim in claims:
            recorder.add(answer(claim, 503, started, (0.0,)))  # a retry: the row stays
        batch = await recorder.next_batch()
        assert batch is not None
        await recorder.write(batch, {})
        conn.execute("SELECT pg_terminate_backend(%s)", [recorder.conn.info.backend_pid])
        await asyncio.sleep(0.2)
        recorder.check_connection()
        check = await recorder.next_batch()
        assert check is not None
        await recorder.write(check, {})
        await recorder.conn.close()
        return [claim.id for claim in claims]

    ids = asyncio.run(scenario())
    assert count(conn, "SELECT count(*) FROM deliveries WHERE id = ANY (%s)"
                       " AND status = 'pending' AND attempt = 1", ids) == EVENTS
    assert count(conn, "SELECT count(*) FROM delivery_attempts"
                       " WHERE delivery_id = ANY (%s)", ids) == EVENTS

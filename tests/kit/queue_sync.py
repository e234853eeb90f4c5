"""The production queue operations (engine/db/queue_async.py) called from synchronous test
code, one function each, with the production signature but a synchronous connection.

Production runs them on asyncio connections (the worker, ingress, the API). A test holds
a synchronous one (the `conn` fixture): each function here opens, once per such
connection, an autocommit AsyncConnection to the same database, its *twin*, on an event
loop of its own, and runs the production function on it, so the test runs the
transaction production runs. The twin is a second session: it does not see what `conn`
has not committed, nor share its session settings (`execute` runs one on both) or its
backend pid (`backend_pid` gives the twin's). The twin closes with `conn`'s garbage
collection, or when the test's database is dropped.

`enqueue_events` is the exception: the test's events often belong in `conn`'s own
transaction (a table lock held across the insert, a rollback), so it runs the production
statement and parameters (queue_async.enqueue_params, .enqueued) on `conn` itself.

engine/db/queue.py's release_claims and return_claims are synchronous in production too:
tests call them directly.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import weakref
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import make_conninfo

from engine.db import queries, queue_async
from engine.db.queue import REPLAY_BATCH
from engine.domain import DEFAULT_TENANT_ID, BreakerSettings, Claim, EventIn, Result

T = TypeVar("T")


class _Twin:
    """An event loop and an autocommit AsyncConnection to `conn`'s database."""

    def __init__(self, conn: psycopg.Connection) -> None:
        info = conn.info
        dsn = make_conninfo(info.dsn, password=info.password) if info.password else info.dsn
        self.loop = asyncio.new_event_loop()
        self.conn = self.run(psycopg.AsyncConnection.connect(dsn, autocommit=True))

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(work)

    def close(self) -> None:
        """Close without the event loop: a finalizer may run inside another one."""
        self.conn.pgconn.finish()
        self.loop.close()


_twins: weakref.WeakKeyDictionary[psycopg.Connection, _Twin] = weakref.WeakKeyDictionary()


def _twin(conn: psycopg.Connection) -> _Twin:
    twin = _twins.get(conn)
    if twin is None or twin.conn.closed:
        twin = _twins[conn] = _Twin(conn)
        weakref.finalize(conn, twin.close)
    return twin


def execute(conn: psycopg.Connection, statement: str, params: Sequence[object] = ()) -> None:
    """Run a session statement (a setting, the search_path) on `conn` and on its twin."""
    conn.execute(statement, params)  # type: ignore[arg-type]
    twin = _twin(conn)
    twin.run(twin.conn.execute(statement, params))  # type: ignore[arg-type]


def backend_pid(conn: psycopg.Connection) -> int:
    """The backend pid of `conn`'s twin: the session the functions below run in."""
    return _twin(conn).conn.info.backend_pid


def claim_batch(
    conn: psycopg.Connection, worker: str, limit: int, lease_ms: int,
    first_attempt_reserve: int = 0, skip_destinations: Sequence[int] = (),
    announce_backlog: bool = False,
) -> list[Claim]:
    twin = _twin(conn)
    return twin.run(queue_async.claim_batch(
        twin.conn, worker, limit, lease_ms, first_attempt_reserve, skip_destinations,
        announce_backlog))


def record_results(
    conn: psycopg.Connection, worker: str, results: Sequence[Result],
    breaker: BreakerSettings | None = None,
) -> int:
    twin = _twin(conn)
    return twin.run(queue_async.record_results(twin.conn, worker, results, breaker))


def record_results_and_refill(
    conn: psycopg.Connection, worker: str, results: Sequence[Result], lease_ms: int,
    refill: Mapping[int, int], breaker: BreakerSettings | None = None,
    spares: Mapping[int, int] = {},
) -> list[Claim]:
    twin = _twin(conn)
    return twin.run(queue_async.record_results_and_refill(
        twin.conn, worker, results, lease_ms, refill, breaker, spares))


def replay_delivery(conn: psycopg.Connection, delivery_id: int,
                    tenant_id: int = DEFAULT_TENANT_ID) -> bool:
    twin = _twin(conn)
    return twin.run(queue_async.replay_delivery(twin.conn, tenant_id, delivery_id))


def replay_dead(
    conn: psycopg.Connection, destination_id: int, since: dt.datetime | None = None,
    batch: int = REPLAY_BATCH,
) -> int:
    twin = _twin(conn)
    return twin.run(queue_async.replay_dead(twin.conn, destination_id, since, batch))


def enqueue_events(
    conn: psycopg.Connection, events: Sequence[EventIn]
) -> list[tuple[int | None, int]]:
    """queue_async.enqueue_events's statement on `conn` itself, in its transaction."""
    cursor = queries.ENQUEUE_EVENTS.run_sync(conn, queue_async.enqueue_params(events))
    return queue_async.enqueued(cursor.fetchall())


def notify_deliveries(conn: psycopg.Connection) -> None:
    """queue_async.notify_deliveries's statement on `conn` itself: the idle workers wake as
    after an event accepted through ingress, not at their next poll."""
    queries.NOTIFY_DELIVERIES.run_sync(conn, queue_async.NOTIFY_PARAMS)

"""Rows tests write and read directly: destinations, events, and counts of what happened."""

from __future__ import annotations

import datetime as dt

import psycopg

from engine.domain import EventIn
from tests.kit import queue_sync

LEASE_MS = 60_000


def add_destination(conn: psycopg.Connection, **columns: object) -> int:
    columns.setdefault("url", "http://127.0.0.1:9/hook")
    columns.setdefault("secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    names = list(columns)
    placeholders = ", ".join(["%s"] * len(names))
    row = conn.execute(
        f"INSERT INTO destinations ({', '.join(names)}) VALUES ({placeholders}) RETURNING id",
        list(columns.values()),
    ).fetchone()
    assert row is not None
    return int(row[0])


def add_tenant(conn: psycopg.Connection, uid: str, **columns: object) -> int:
    """A tenant row (its limits, `disabled`, ... as keyword columns); returns its id."""
    names = ["uid", *columns]
    row = conn.execute(
        f"INSERT INTO tenants ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})"
        " RETURNING id", [uid, *columns.values()]).fetchone()
    assert row is not None
    return int(row[0])


def now(conn: psycopg.Connection) -> dt.datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def statuses(conn: psycopg.Connection) -> dict[int, str]:
    rows = conn.execute(
        "SELECT id, status::text FROM deliveries UNION ALL"
        " SELECT id, status::text FROM finished_deliveries"
    ).fetchall()
    return {int(r[0]): r[1] for r in rows}


def enqueue(conn: psycopg.Connection, payloads: list[str], destinations: list[int]) -> list[int]:
    with conn.transaction():
        answers = queue_sync.enqueue_events(
            conn, [EventIn("test.event", p, destinations) for p in payloads]
        )
    return [int(event_id) for event_id, _ in answers if event_id is not None]


def finished(conn: psycopg.Connection, destination: int, status: str = "delivered") -> int:
    row = conn.execute(
        "SELECT count(*) FROM finished_deliveries WHERE destination_id = %s AND status = %s",
        [destination, status],
    ).fetchone()
    assert row is not None
    return int(row[0])


def count(conn: psycopg.Connection, query: str, *params: object) -> int:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])

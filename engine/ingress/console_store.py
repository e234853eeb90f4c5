"""The console's reads: events, deliveries by event type or time, per-destination stats and
the overview. Each statement is a file under engine/sql/ whose header says which index
serves it; tests/test_console_plan.py holds them to that with a million finished
deliveries."""

from __future__ import annotations

import datetime as dt

import psycopg
from psycopg import AsyncConnection

from engine import queries, queue, status
from engine.ingress import schemas as s


async def _fetchall(conn: AsyncConnection, statement: bytes, params: tuple) -> list[tuple]:
    cursor = await queue._run_async(conn, statement, params)
    return await cursor.fetchall()


async def list_events(
    conn: AsyncConnection, event_type: str | None, since: dt.datetime | None,
    until: dt.datetime | None, after_id: int | None, limit: int,
) -> list[s.EventSummary]:
    params: tuple = (since, until, after_id, limit)
    statement = queries.CONSOLE_EVENTS
    if event_type is not None:
        statement, params = queries.CONSOLE_EVENTS_BY_TYPE, (*params, event_type)
    return [s.EventSummary(*row) for row in await _fetchall(conn, statement, params)]


async def list_deliveries_by_event(
    conn: AsyncConnection, event_type: str | None, since: dt.datetime | None,
    until: dt.datetime | None, status_: str | None, destination_id: int | None,
    after_id: int | None, limit: int,
) -> list[s.Delivery]:
    """Deliveries of the events of a type and/or a time range, newest event first."""
    statement = (queries.CONSOLE_DELIVERIES_BY_TIME if event_type is None
                 else queries.CONSOLE_DELIVERIES_BY_TYPE)
    rows = await _fetchall(
        conn, statement, (event_type, since, until, status_, destination_id, after_id, limit)
    )
    return [s.Delivery(*row) for row in rows]


async def destination_stats(
    conn: AsyncConnection, destination_id: int, window_s: float,
    dead_since: dt.datetime | None,
) -> s.DestinationStats:
    rows = await _fetchall(conn, queries.DESTINATION_STATS,
                           (destination_id, window_s, dead_since))
    return s.DestinationStats(destination_id, window_s, *rows[0], dead_since)


def overview(conn: psycopg.Connection, window_s: float) -> s.Overview:
    """Blocking (ingress runs it in a thread): engine status's own collection, so the
    console shows the same numbers and warnings, plus the per-minute chart and the
    per-destination window."""
    collected = status.collect_status(conn)
    minutes = psycopg.RawCursor(conn).execute(queries.CONSOLE_MINUTES, ()).fetchall()
    destinations = psycopg.RawCursor(conn).execute(
        queries.CONSOLE_DESTINATION_WINDOW, (window_s,)
    ).fetchall()
    queue_row = collected["queue"]
    return s.Overview(
        at=collected["at"],
        window_s=window_s,
        queue=s.QueueDepth(**{f: queue_row[f] for f in s.QueueDepth.__struct_fields__}),
        breakers=s.BreakerCounts(**collected["breakers"]),
        per_minute=[s.MinuteCount(*row) for row in minutes],
        destinations=[s.DestinationSummary(*row) for row in destinations],
        warnings=collected["warnings"],
    )

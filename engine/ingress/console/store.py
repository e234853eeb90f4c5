"""The console's reads: events, deliveries by event type or time, per-destination stats and
the overview (the last two from the per-minute rollup, schema/011, whose duration
histograms become percentiles here). Each statement is a file under engine/sql/ whose
header says which index serves it; tests/test_console_plan.py holds them to that with a
million finished deliveries."""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from engine.db import queries
from engine.db.queries import Statement
from engine.db.sql_params import (
    ConsoleDeadDeliveriesParams,
    ConsoleDeliveriesParams,
    ConsoleDestinationWindowParams,
    ConsoleEventsParams,
    DestinationStatsParams,
    StatusDestinationsParams,
)
from engine.ingress import schemas as s
from engine.ingress.http import TenantScope
from engine.observe import status
from engine.observe.duration_histogram import percentile


async def _fetchall(conn: AsyncConnection, statement: Statement, params: tuple | None
                    ) -> list[tuple]:
    return await (await statement.run(conn, params)).fetchall()


async def list_events(
    conn: AsyncConnection, tenant: TenantScope, event_type: str | None, since: dt.datetime | None,
    until: dt.datetime | None, after_id: int | None, limit: int,
) -> list[s.EventSummary]:
    params = ConsoleEventsParams(
        since=since, until=until, after_id=after_id, limit=limit, event_type=event_type,
        tenant_id=tenant.id)
    rows = await _fetchall(conn, queries.CONSOLE_EVENTS, params)
    return [s.EventSummary(*row, tenant.uid) for row in rows]


async def list_deliveries_by_event(
    conn: AsyncConnection, tenant: TenantScope, event_type: str | None, since: dt.datetime | None,
    until: dt.datetime | None, status_: str | None, destination_id: int | None,
    after_id: int | None, limit: int,
) -> list[s.Delivery]:
    """Deliveries of the events of a type and/or a time range, newest event first."""
    params = ConsoleDeliveriesParams(
        event_type=event_type, since=since, until=until, status=status_,
        destination_id=destination_id, after_id=after_id, limit=limit, tenant_id=tenant.id,
    )
    rows = await _fetchall(conn, queries.CONSOLE_DELIVERIES_BY_EVENT, params)
    return [s.Delivery(*row, tenant.uid) for row in rows]


async def list_dead(
    conn: AsyncConnection, tenant: TenantScope, destination_id: int | None,
    before_id: int | None, limit: int,
) -> list[s.Delivery]:
    params = ConsoleDeadDeliveriesParams(
        destination_id=destination_id, before_id=before_id, limit=limit, tenant_id=tenant.id)
    rows = await _fetchall(conn, queries.CONSOLE_DEAD_DELIVERIES, params)
    return [s.Delivery(*row, tenant.uid) for row in rows]


async def destination_stats(
    conn: AsyncConnection, destination_id: int, window_s: float,
    dead_since: dt.datetime | None,
) -> s.DestinationStats:
    params = DestinationStatsParams(
        destination_id=destination_id, window_seconds=window_s, dead_since=dead_since)
    rows = await _fetchall(conn, queries.DESTINATION_STATS, params)
    (attempts, succeeded, http_error, transport_error, counts, lowest, highest, pending,
     in_flight, dead) = rows[0]
    p50, p90, p99 = (percentile(counts or (), q, lowest, highest) for q in (0.5, 0.9, 0.99))
    return s.DestinationStats(destination_id, window_s, attempts, succeeded, http_error,
                              transport_error, p50, p90, p99, pending, in_flight, dead,
                              dead_since)


def _destination_summary(row: tuple) -> s.DestinationSummary:
    (id_, pending, in_flight, attempts, succeeded, counts, lowest, highest, last_error,
     last_error_at) = row
    return s.DestinationSummary(
        id_, pending, in_flight, attempts, succeeded,
        percentile(counts or (), 0.5, lowest, highest),
        percentile(counts or (), 0.99, lowest, highest), last_error, last_error_at)


# status_fanout.sql's averages read a day of events: at most this often, per
# ingress process, however many consoles refresh.
FANOUT_REFRESH_S = 300.0
_fanout: dict[str, Any] = {"at": -math.inf, "queue": {}}


async def _rows(conn: AsyncConnection, statement: Statement, params: tuple | None = None
                ) -> list[dict]:
    return await (await statement.run(conn, params, row_factory=dict_row)).fetchall()


async def _fanout_figures(conn: AsyncConnection) -> dict[str, Any]:
    if time.monotonic() - _fanout["at"] >= FANOUT_REFRESH_S:
        _fanout["queue"] = (await _rows(conn, queries.STATUS_FANOUT))[0]
        _fanout["at"] = time.monotonic()
    return _fanout["queue"]


async def _statement_shares(conn: AsyncConnection) -> dict | None:
    """What status.collect_status reads from pg_stat_statements, on the asyncio side."""
    if not await _rows(conn, queries.PG_STAT_STATEMENTS_INSTALLED):
        return None
    try:
        async with conn.transaction():
            return (await _rows(conn, queries.STATUS_STATEMENTS))[0]
    except psycopg.Error:  # installed but not preloaded
        return None


async def overview(conn: AsyncConnection, window_s: float) -> s.Overview:
    """The figures and warnings of `engine status` (status.warnings over the same
    statements, in one snapshot), except that the fan-out averages come from
    _fanout_figures; plus the per-minute chart and each destination's window."""
    fanout = await _fanout_figures(conn)
    async with conn.transaction():
        await queries.SNAPSHOT_READ_ONLY.run(conn)
        depth = (await _rows(conn, queries.STATUS_QUEUE))[0]
        collected: dict[str, Any] = {
            "queue": {**depth, **fanout},
            "breakers": (await _rows(conn, queries.STATUS_BREAKERS))[0],
            "destinations": await _rows(conn, queries.STATUS_DESTINATIONS, StatusDestinationsParams(
                top_n=status.TOP_DESTINATIONS)),
            "tables": await _rows(conn, queries.STATUS_TABLES),
            "pg_stat_statements": await _statement_shares(conn),
            # The ingress pool's session: opened like every engine process's.
            "settings": (await _rows(conn, queries.STATUS_SETTINGS))[0],
        }
        minutes = await _fetchall(conn, queries.CONSOLE_MINUTES, None)
        destinations = await _fetchall(conn, queries.CONSOLE_DESTINATION_WINDOW,
                                      ConsoleDestinationWindowParams(window_seconds=window_s))
        now = await _fetchall(conn, queries.DATABASE_NOW, None)
    return s.Overview(
        at=now[0][0],
        window_s=window_s,
        queue=s.QueueDepth(**depth),
        breakers=s.BreakerCounts(**collected["breakers"]),
        per_minute=[s.MinuteCount(*row) for row in minutes],
        destinations=[_destination_summary(row) for row in destinations],
        warnings=status.warnings(collected),
    )

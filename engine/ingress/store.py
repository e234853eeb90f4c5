"""The API's reads and destination changes. None of these is on the hot path (accepting
events goes through committer.py), so they are plain parameterised statements here."""

from __future__ import annotations

import msgspec
from psycopg import AsyncConnection

from engine.database import run_statement_async
from engine.destination_options import format_duration
from engine.ingress.schemas import Attempt, Delivery, DeliveryDetail, Destination, Event

_json = msgspec.json.Encoder()


class DeliveryOptions(msgspec.Struct):
    """The per-destination delivery options, validated (engine/destination_options.py).
    On a PATCH, a field left UNSET keeps the column."""

    rate_limit: float | msgspec.UnsetType | None = msgspec.UNSET
    headers: dict[str, str] | msgspec.UnsetType | None = msgspec.UNSET
    retry_schedule: list[float] | msgspec.UnsetType | None = msgspec.UNSET

    def params(self) -> tuple[object, ...]:
        """(set, value) pairs for PATCH_DESTINATION's $14-$19."""
        headers = self.headers
        return (
            self.rate_limit is not msgspec.UNSET, _value(self.rate_limit),
            headers is not msgspec.UNSET,
            None if headers is None or headers is msgspec.UNSET else _json.encode(headers).decode(),
            self.retry_schedule is not msgspec.UNSET, _value(self.retry_schedule),
        )


def _value(value: object) -> object:
    return None if value is msgspec.UNSET else value

_DESTINATION_COLUMNS = b"""
    id, url, event_types, max_in_flight, ordered, timeout_ms, paused, disabled,
    disabled_reason, paused_until, breaker::text, consecutive_failures, created_at,
    updated_at, rate_limit, headers, retry_schedule, failing_since, secret,
    previous_secret_until
"""

CREATE_DESTINATION = b"""
INSERT INTO destinations (url, secret, event_types, max_in_flight, ordered, timeout_ms,
                          rate_limit, headers, retry_schedule)
VALUES ($1::text, $2::text, $3::text[], $4::int, $5::bool, $6::int, $7::float8,
        $8::text::jsonb, $9::float8[])
RETURNING""" + _DESTINATION_COLUMNS

LIST_DESTINATIONS = (
    b"SELECT" + _DESTINATION_COLUMNS + b"FROM destinations WHERE deleted_at IS NULL ORDER BY id"
)

READ_DESTINATION = (
    b"SELECT" + _DESTINATION_COLUMNS
    + b"FROM destinations WHERE id = $1::bigint AND deleted_at IS NULL"
)

# Every field is optional: a NULL value (or a false `set_*` flag for nullable columns)
# keeps the column. Resuming (paused or disabled set to false) also closes the breaker,
# so the operator's "go" is not held back by an old failure streak, and restarts the
# auto-disable clock (failing_since). Right-hand sides see
# the old row, so `previous_secret = secret` keeps the secret being replaced.
PATCH_DESTINATION = b"""
UPDATE destinations SET
    url = coalesce($2::text, url),
    event_types = CASE WHEN $3::bool THEN $4::text[] ELSE event_types END,
    max_in_flight = CASE WHEN $5::bool THEN $6::int ELSE max_in_flight END,
    ordered = coalesce($7::bool, ordered),
    timeout_ms = coalesce($8::int, timeout_ms),
    paused = coalesce($9::bool, paused),
    disabled = coalesce($10::bool, disabled),
    disabled_reason = CASE WHEN $10::bool IS NULL THEN disabled_reason
                           WHEN $10::bool THEN 'disabled by operator' END,
    previous_secret = CASE WHEN $11::text IS NULL THEN previous_secret ELSE secret END,
    previous_secret_until = CASE WHEN $11::text IS NULL THEN previous_secret_until
                                 ELSE now() + $12::bigint * interval '1 millisecond' END,
    secret = coalesce($11::text, secret),
    breaker = CASE WHEN $13::bool THEN 'closed' ELSE breaker END,
    paused_until = CASE WHEN $13::bool THEN NULL ELSE paused_until END,
    consecutive_failures = CASE WHEN $13::bool THEN 0 ELSE consecutive_failures END,
    breaker_pause_ms = CASE WHEN $13::bool THEN 0 ELSE breaker_pause_ms END,
    failing_since = CASE WHEN $13::bool THEN NULL ELSE failing_since END,
    disabled_at = CASE WHEN $10::bool IS NULL THEN disabled_at
                       WHEN $10::bool THEN coalesce(disabled_at, now()) END,
    rate_limit = CASE WHEN $14::bool THEN $15::float8 ELSE rate_limit END,
    headers = CASE WHEN $16::bool THEN $17::text::jsonb ELSE headers END,
    retry_schedule = CASE WHEN $18::bool THEN $19::float8[] ELSE retry_schedule END,
    updated_at = now()
WHERE id = $1::bigint AND deleted_at IS NULL
RETURNING""" + _DESTINATION_COLUMNS

DELETE_DESTINATION = b"""
UPDATE destinations SET deleted_at = now(), updated_at = now()
 WHERE id = $1::bigint AND deleted_at IS NULL
RETURNING id
"""

_DELIVERY_COLUMNS = b"""
    id, event_id, destination_id, status::text, attempt, next_attempt_at, last_error,
    created_at"""

READ_EVENT = b"""
SELECT id, type, payload, ordering_key, idempotency_key, created_at
  FROM events WHERE id = $1::bigint
"""

EVENT_DELIVERIES = (
    b"SELECT" + _DELIVERY_COLUMNS + b", NULL::timestamptz FROM deliveries"
    b" WHERE event_id = $1::bigint"
    b" UNION ALL SELECT" + _DELIVERY_COLUMNS + b", completed_at FROM finished_deliveries"
    b" WHERE event_id = $1::bigint ORDER BY id"
)

# Keyset pagination, newest first, over both tables (they share one id sequence). Each
# side is limited on its own so it can walk an index backwards and stop early. $5/$6 say
# which tables can hold the wanted status at all (pending/in_flight live only in
# `deliveries`, delivered/dead only in `finished_deliveries`): a false one is a one-time
# filter, so that side is not scanned at all.
#   $1 status text (NULL: any), $2 before id, $3 limit, $4 scan deliveries,
#   $5 scan finished_deliveries, $6 destination id (by-destination variant only)
_LIST_ALL_SIDE = b"""
      WHERE ($1::text IS NULL OR status::text = $1::text)
        AND ($2::bigint IS NULL OR id < $2::bigint)"""
# By destination: (destination_id, id) on finished_deliveries; (destination_id, status)
# on the hot table, whose rows per destination are that destination's backlog.
_LIST_DESTINATION_SIDE = _LIST_ALL_SIDE + b"""
        AND destination_id = $6::bigint"""


def _list_deliveries(side: bytes) -> bytes:
    return (
        b"(SELECT" + _DELIVERY_COLUMNS + b", NULL::timestamptz FROM deliveries" + side
        + b" AND $4::bool ORDER BY id DESC LIMIT $3::int)"
        b" UNION ALL (SELECT" + _DELIVERY_COLUMNS + b", completed_at FROM finished_deliveries"
        + side + b" AND $5::bool ORDER BY id DESC LIMIT $3::int)"
        b" ORDER BY id DESC LIMIT $3::int"
    )


LIST_DELIVERIES = _list_deliveries(_LIST_ALL_SIDE)
LIST_DESTINATION_DELIVERIES = _list_deliveries(_LIST_DESTINATION_SIDE)
HOT_STATUSES = ("pending", "in_flight")

READ_DELIVERY = (
    b"SELECT" + _DELIVERY_COLUMNS + b", NULL::timestamptz FROM deliveries WHERE id = $1::bigint"
    b" UNION ALL SELECT" + _DELIVERY_COLUMNS + b", completed_at FROM finished_deliveries"
    b" WHERE id = $1::bigint"
)

READ_ATTEMPTS = b"""
SELECT attempt, started_at, duration_ms, status_code, error, response_body
  FROM delivery_attempts WHERE delivery_id = $1::bigint ORDER BY id
"""


def _destination(row: tuple, with_secret: bool = False) -> Destination:
    *columns, schedule, failing_since, secret, previous_until = row
    delays = None if schedule is None else [format_duration(d) for d in schedule]
    destination = Destination(*columns, delays, failing_since)
    if with_secret:
        destination.secret = secret
        destination.previous_secret_until = previous_until
    return destination


async def _fetchone(conn: AsyncConnection, statement: bytes, params: tuple) -> tuple | None:
    cursor = await run_statement_async(conn, statement, params)
    return await cursor.fetchone()


async def _fetchall(conn: AsyncConnection, statement: bytes, params: tuple) -> list[tuple]:
    cursor = await run_statement_async(conn, statement, params)
    return await cursor.fetchall()


async def create_destination(
    conn: AsyncConnection, url: str, secret: str, event_types: list[str] | None,
    max_in_flight: int | None, ordered: bool, timeout_ms: int,
    options: DeliveryOptions | None = None,
) -> Destination:
    _, rate, _, headers, _, schedule = (options or DeliveryOptions()).params()
    row = await _fetchone(
        conn, CREATE_DESTINATION,
        (url, secret, event_types, max_in_flight, ordered, timeout_ms, rate, headers,
         schedule),
    )
    assert row is not None
    return _destination(row, with_secret=True)


async def list_destinations(conn: AsyncConnection) -> list[Destination]:
    return [_destination(row) for row in await _fetchall(conn, LIST_DESTINATIONS, ())]


async def read_destination(conn: AsyncConnection, destination_id: int) -> Destination | None:
    row = await _fetchone(conn, READ_DESTINATION, (destination_id,))
    return _destination(row) if row else None


async def patch_destination(
    conn: AsyncConnection, destination_id: int, *, url: str | None,
    set_event_types: bool, event_types: list[str] | None,
    set_max_in_flight: bool, max_in_flight: int | None,
    ordered: bool | None, timeout_ms: int | None, paused: bool | None,
    disabled: bool | None, new_secret: str | None, previous_secret_ms: int,
    options: DeliveryOptions | None = None,
) -> Destination | None:
    resume = paused is False or disabled is False
    row = await _fetchone(
        conn, PATCH_DESTINATION,
        (
            destination_id, url, set_event_types, event_types, set_max_in_flight,
            max_in_flight, ordered, timeout_ms, paused, disabled, new_secret,
            previous_secret_ms, resume, *(options or DeliveryOptions()).params(),
        ),
    )
    return _destination(row, with_secret=new_secret is not None) if row else None


async def delete_destination(conn: AsyncConnection, destination_id: int) -> bool:
    return await _fetchone(conn, DELETE_DESTINATION, (destination_id,)) is not None


async def read_event(conn: AsyncConnection, event_id: int) -> Event | None:
    row = await _fetchone(conn, READ_EVENT, (event_id,))
    if row is None:
        return None
    deliveries = [Delivery(*r) for r in await _fetchall(conn, EVENT_DELIVERIES, (event_id,))]
    event_id, type_, payload, ordering_key, idempotency_key, created_at = row
    return Event(
        event_id, type_, msgspec.Raw(payload.encode()), ordering_key, idempotency_key,
        created_at, deliveries,
    )


async def list_deliveries(
    conn: AsyncConnection, destination_id: int | None, status: str | None,
    before_id: int | None, limit: int,
) -> list[Delivery]:
    scan_hot = status is None or status in HOT_STATUSES
    scan_finished = status is None or status not in HOT_STATUSES
    params: tuple = (status, before_id, limit, scan_hot, scan_finished)
    statement = LIST_DELIVERIES
    if destination_id is not None:
        statement = LIST_DESTINATION_DELIVERIES
        params = (*params, destination_id)
    return [Delivery(*r) for r in await _fetchall(conn, statement, params)]


async def read_delivery(conn: AsyncConnection, delivery_id: int) -> DeliveryDetail | None:
    row = await _fetchone(conn, READ_DELIVERY, (delivery_id,))
    if row is None:
        return None
    attempts = [Attempt(*r) for r in await _fetchall(conn, READ_ATTEMPTS, (delivery_id,))]
    return DeliveryDetail(*row, attempts=attempts)


async def read_delivery_row(conn: AsyncConnection, delivery_id: int) -> Delivery | None:
    row = await _fetchone(conn, READ_DELIVERY, (delivery_id,))
    return Delivery(*row) if row else None


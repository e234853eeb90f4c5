"""The API's reads and destination changes (engine/sql/api_*.sql). None of these is on the
hot path: accepting events goes through committer.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import msgspec
from psycopg import AsyncConnection

from engine.db import queries
from engine.db.queries import Statement
from engine.db.sql_params import (
    ApiDeliveriesListParams,
    ApiDestinationCreateParams,
    ApiDestinationDeliveriesListParams,
    ApiDestinationPatchParams,
    EventPayloadDeleteParams,
    TenantDeliveryParams,
    TenantDestinationParams,
    TenantEventParams,
    TenantParams,
)
from engine.ingress.http import TenantScope
from engine.ingress.schemas import (
    Attempt,
    AuthInfo,
    Delivery,
    DeliveryDetail,
    Destination,
    Event,
    TlsInfo,
)
from engine.webhooks.destination_options import format_duration
from engine.webhooks.egress import fingerprints

_json = msgspec.json.Encoder()


class DeliveryOptions(msgspec.Struct):
    """The per-destination delivery and routing options, validated
    (engine/webhooks/destination_options.py, engine/webhooks/routing.py). On a PATCH, a
    field left UNSET keeps the column."""

    rate_limit: float | msgspec.UnsetType | None = msgspec.UNSET
    headers: dict[str, str] | msgspec.UnsetType | None = msgspec.UNSET
    retry_schedule: list[float] | msgspec.UnsetType | None = msgspec.UNSET
    # The filter as stored and its jsonpath (routing.compile_filter); None: no filter.
    filter: tuple[str, str] | msgspec.UnsetType | None = msgspec.UNSET
    channels: list[str] | msgspec.UnsetType | None = msgspec.UNSET
    # Its POSTs carry a `traceparent` (docs/decisions/0035).
    propagate_trace: bool | msgspec.UnsetType = msgspec.UNSET

    def filter_columns(self) -> tuple[str | None, str | None]:
        """The filter as api_destination_*.sql bind it: (JSON text, jsonpath), or NULLs."""
        if self.filter is None or self.filter is msgspec.UNSET:
            return None, None
        return self.filter

    def headers_json(self) -> str | None:
        """The headers as api_destination_*.sql bind them: a JSON object, or NULL."""
        if self.headers is None or self.headers is msgspec.UNSET:
            return None
        return _json.encode(self.headers).decode()


class EgressSettings(msgspec.Struct):
    """A destination's egress settings, validated (engine/webhooks/egress.py). On a PATCH,
    a field left UNSET keeps its columns; `tls` is (client_cert, client_key, ca_bundle)."""

    tls: tuple[str | None, str | None, str | None] | msgspec.UnsetType | None = msgspec.UNSET
    proxy: str | msgspec.UnsetType | None = msgspec.UNSET
    auth: dict[str, str] | msgspec.UnsetType | None = msgspec.UNSET

    def tls_columns(self) -> tuple[str | None, str | None, str | None]:
        return (None, None, None) if not isinstance(self.tls, tuple) else self.tls

    def auth_json(self) -> str | None:
        return None if not isinstance(self.auth, dict) else _json.encode(self.auth).decode()


def _value(value: object) -> object:
    return None if value is msgspec.UNSET else value


Built = TypeVar("Built")  # what _row_with_its_rows builds

HOT_STATUSES = ("pending", "in_flight")


def _tls_info(client_cert: str | None, key_set: bool, ca_bundle: str | None) -> TlsInfo | None:
    if client_cert is None and ca_bundle is None:
        return None
    return TlsInfo(client_cert_sha256=fingerprints(client_cert)[0] if client_cert else None,
                   client_key_set=key_set,
                   ca_bundle_sha256=fingerprints(ca_bundle) if ca_bundle else None)


def _destination(row: tuple, tenant: TenantScope, with_secret: bool = False) -> Destination:
    (*columns, schedule, failing_since, secret, previous_until, filter_, channels,
     client_cert, key_set, ca_bundle, proxy, auth, propagate_trace) = row
    delays = None if schedule is None else [format_duration(d) for d in schedule]
    destination = Destination(*columns, delays, failing_since, tenant.uid, filter_, channels)
    if with_secret:
        destination.secret = secret
        destination.previous_secret_until = previous_until
    # The client key and the client secret are never read back (api_destination_*.sql
    # select only whether they are set).
    destination.tls = _tls_info(client_cert, key_set, ca_bundle)
    destination.proxy = proxy
    destination.propagate_trace = propagate_trace
    if auth is not None:
        destination.auth = AuthInfo(auth["type"], auth["token_url"], auth["client_id"],
                                    auth.get("scope"), client_secret_set=True)
    return destination


async def _fetchone(conn: AsyncConnection, statement: Statement, params: tuple | None
                    ) -> tuple | None:
    return await (await statement.run(conn, params)).fetchone()


async def _fetchall(conn: AsyncConnection, statement: Statement, params: tuple | None
                    ) -> list[tuple]:
    return await (await statement.run(conn, params)).fetchall()


async def create_destination(
    conn: AsyncConnection, tenant: TenantScope, url: str, secret: str,
    event_types: list[str] | None, max_in_flight: int | None, ordered: bool, timeout_ms: int,
    options: DeliveryOptions | None = None, egress: EgressSettings | None = None,
) -> Destination:
    options = options or DeliveryOptions()
    filter_json, filter_path = options.filter_columns()
    egress = egress or EgressSettings()
    client_cert, client_key, ca_bundle = egress.tls_columns()
    params = ApiDestinationCreateParams(
        url=url, secret=secret, event_types=event_types, max_in_flight=max_in_flight,
        ordered=ordered, timeout_ms=timeout_ms, rate_limit=_value(options.rate_limit),
        headers=options.headers_json(), retry_schedule=_value(options.retry_schedule),
        tenant_id=tenant.id, filter=filter_json, filter_path=filter_path,
        channels=_value(options.channels), tls_client_cert=client_cert, tls_client_key=client_key,
        tls_ca_bundle=ca_bundle, proxy=_value(egress.proxy), auth=egress.auth_json(),
        propagate_trace=_value(options.propagate_trace),
    )
    row = await _fetchone(conn, queries.API_DESTINATION_CREATE, params)
    assert row is not None
    return _destination(row, tenant, with_secret=True)


async def list_destinations(conn: AsyncConnection, tenant: TenantScope) -> list[Destination]:
    rows = await _fetchall(conn, queries.API_DESTINATIONS_LIST, TenantParams(tenant_id=tenant.id))
    return [_destination(row, tenant) for row in rows]


async def read_destination(
    conn: AsyncConnection, tenant: TenantScope, destination_id: int
) -> Destination | None:
    row = await _fetchone(conn, queries.API_DESTINATION_READ, TenantDestinationParams(
        destination_id=destination_id, tenant_id=tenant.id))
    return _destination(row, tenant) if row else None


async def patch_destination(
    conn: AsyncConnection, tenant: TenantScope, destination_id: int, *, url: str | None,
    set_event_types: bool, event_types: list[str] | None,
    set_max_in_flight: bool, max_in_flight: int | None,
    ordered: bool | None, timeout_ms: int | None, paused: bool | None,
    disabled: bool | None, new_secret: str | None, previous_secret_ms: int,
    options: DeliveryOptions | None = None, egress: EgressSettings | None = None,
) -> Destination | None:
    options = options or DeliveryOptions()
    filter_json, filter_path = options.filter_columns()
    egress = egress or EgressSettings()
    client_cert, client_key, ca_bundle = egress.tls_columns()
    params = ApiDestinationPatchParams(
        destination_id=destination_id, url=url, set_event_types=set_event_types,
        event_types=event_types, set_max_in_flight=set_max_in_flight,
        max_in_flight=max_in_flight, ordered=ordered, timeout_ms=timeout_ms, paused=paused,
        disabled=disabled, new_secret=new_secret, previous_secret_ms=previous_secret_ms,
        resume=paused is False or disabled is False,
        # An UNSET option keeps its column; None sets it to NULL.
        set_rate_limit=options.rate_limit is not msgspec.UNSET,
        rate_limit=_value(options.rate_limit),
        set_headers=options.headers is not msgspec.UNSET, headers=options.headers_json(),
        set_retry_schedule=options.retry_schedule is not msgspec.UNSET,
        retry_schedule=_value(options.retry_schedule), tenant_id=tenant.id,
        set_filter=options.filter is not msgspec.UNSET, filter=filter_json,
        filter_path=filter_path,
        set_channels=options.channels is not msgspec.UNSET, channels=_value(options.channels),
        set_tls=egress.tls is not msgspec.UNSET, tls_client_cert=client_cert,
        tls_client_key=client_key, tls_ca_bundle=ca_bundle,
        set_proxy=egress.proxy is not msgspec.UNSET, proxy=_value(egress.proxy),
        set_auth=egress.auth is not msgspec.UNSET, auth=egress.auth_json(),
        propagate_trace=_value(options.propagate_trace),
    )
    row = await _fetchone(conn, queries.API_DESTINATION_PATCH, params)
    return _destination(row, tenant, with_secret=new_secret is not None) if row else None


async def delete_destination(
    conn: AsyncConnection, tenant: TenantScope, destination_id: int
) -> bool:
    return await _fetchone(conn, queries.API_DESTINATION_DELETE, TenantDestinationParams(
        destination_id=destination_id, tenant_id=tenant.id)) is not None


async def delete_event_payload(
    conn: AsyncConnection, tenant: TenantScope, event_id: int
) -> bool | None:
    """Remove one of the tenant's events' payload: True when removed (or already gone),
    False when a queued delivery still needs it, None for an unknown id or another
    tenant's. One transaction: the event is locked first (event_payload_lock.sql says why)."""
    async with conn.transaction():
        locked = await _fetchone(conn, queries.EVENT_PAYLOAD_LOCK, TenantEventParams(
            event_id=event_id, tenant_id=tenant.id))
        if locked is None:
            return None
        return await _fetchone(conn, queries.EVENT_PAYLOAD_DELETE, EventPayloadDeleteParams(
            event_id=event_id, created_at=locked[0])) is not None


async def _row_with_its_rows(
    conn: AsyncConnection, read: Statement, read_its_rows: Statement, key: tuple,
    build: Callable[[tuple, list[tuple]], Built],
) -> Built | None:
    """One row by its id and the rows that belong to it (an event's deliveries, a
    delivery's attempts), built into the API's type; None when there is no such row.
    Both statements take `key`."""
    row = await _fetchone(conn, read, key)
    if row is None:
        return None
    return build(row, await _fetchall(conn, read_its_rows, key))


async def read_event(conn: AsyncConnection, tenant: TenantScope, event_id: int) -> Event | None:
    def event(row: tuple, rows: list[tuple]) -> Event:
        event_id, type_, payload, ordering_key, idempotency_key, created_at, channels = row
        # A removed payload (payload retention, DELETE /v1/events/{id}/payload) reads null.
        body = msgspec.Raw(payload.encode() if payload is not None else b"null")
        return Event(
            event_id, type_, body, ordering_key, idempotency_key,
            created_at, [Delivery(*r, tenant.uid) for r in rows], tenant.uid, channels,
        )

    return await _row_with_its_rows(
        conn, queries.API_EVENT_READ, queries.API_EVENT_DELIVERIES,
        TenantEventParams(event_id=event_id, tenant_id=tenant.id), event)


async def list_deliveries(
    conn: AsyncConnection, tenant: TenantScope, destination_id: int | None, status: str | None,
    before_id: int | None, limit: int,
) -> list[Delivery]:
    scan_hot = status is None or status in HOT_STATUSES
    scan_finished = status is None or status not in HOT_STATUSES
    statement = queries.API_DELIVERIES_LIST
    params: tuple = ApiDeliveriesListParams(
        status=status, before_id=before_id, limit=limit, scan_deliveries=scan_hot,
        scan_finished_deliveries=scan_finished, tenant_id=tenant.id,
    )
    if destination_id is not None:
        statement = queries.API_DESTINATION_DELIVERIES_LIST
        params = ApiDestinationDeliveriesListParams(
            status=status, before_id=before_id, limit=limit, scan_deliveries=scan_hot,
            scan_finished_deliveries=scan_finished, destination_id=destination_id,
            tenant_id=tenant.id,
        )
    return [Delivery(*r, tenant.uid) for r in await _fetchall(conn, statement, params)]


async def read_delivery(
    conn: AsyncConnection, tenant: TenantScope, delivery_id: int
) -> DeliveryDetail | None:
    return await _row_with_its_rows(
        conn, queries.API_DELIVERY_READ, queries.API_DELIVERY_ATTEMPTS,
        TenantDeliveryParams(delivery_id=delivery_id, tenant_id=tenant.id),
        lambda row, rows: DeliveryDetail(*row, tenant.uid,
                                         attempts=[Attempt(*r) for r in rows]))


async def read_delivery_row(
    conn: AsyncConnection, tenant: TenantScope, delivery_id: int
) -> Delivery | None:
    row = await _fetchone(conn, queries.API_DELIVERY_READ,
                          TenantDeliveryParams(delivery_id=delivery_id, tenant_id=tenant.id))
    return Delivery(*row, tenant.uid) if row else None


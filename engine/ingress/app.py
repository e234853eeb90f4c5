"""The ingress ASGI application: routing, auth, lifespan and the event, delivery and
health handlers.

uvicorn parses HTTP; this module sees ASGI scopes. Each operation declared in openapi.py
is bound to one handler, here or in the mixins destinations_api.py and console/api.py;
requests (http.py) are decoded by the msgspec types of schemas.py.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import re
import time
from typing import Any, NamedTuple

import msgspec
import psycopg
import psycopg_pool

from engine.config import Settings
from engine.db import queries, queue_async
from engine.db.sql_params import EventTypeParams, TenantFindParams
from engine.domain import EventIn
from engine.ingress import errors, store
from engine.ingress import schemas as s
from engine.ingress.catalog import EventTypeCatalog
from engine.ingress.committer import Committer
from engine.ingress.console.api import ConsoleApi, cursor_param
from engine.ingress.dbgate import DatabaseGate
from engine.ingress.destinations_api import DestinationApi
from engine.ingress.errors import ApiError
from engine.ingress.event_types_api import EventTypeApi
from engine.ingress.http import (
    DEFAULT_SCOPE,
    JSON_HEADERS,
    Handler,
    Request,
    Response,
    TenantScope,
    encoder,
    int_param,
    json_response,
)
from engine.ingress.keys import ADMIN, Caller, KeyRing
from engine.ingress.metrics import IngressMetrics
from engine.ingress.openapi import (
    OPERATIONS,
    PORTAL_PAGE_PATH,
    TENANT_PATH,
    Operation,
    build_document,
)
from engine.ingress.portal import PortalApi
from engine.ingress.portal_tokens import OTHER_TENANT
from engine.ingress.tenants_api import TenantApi
from engine.observe import metrics as engine_metrics
from engine.observe.operational_events import RESERVED_EVENT_PREFIX
from engine.observe.tracing import checked_traceparent
from engine.webhooks.routing import channel_list

log = logging.getLogger(__name__)

# A batch carries up to 1000 events: its body may be this many times the per-request
# limit, while each event's payload still keeps to the limit itself.
BATCH_BODY_FACTOR = 32
_TENANT_REFERENCE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_TENANTS_PREFIX = "/v1/tenants/"
_PORTAL_PREFIX = "/portal/"
# Under /v1/tenants/{tenant}/: the tenant's own routes, not a tenant-scoped API path.
_TENANT_OWN_ROUTES = ("keys", "portal")


class PathParams(NamedTuple):
    """What a path's parameters name: a resource's {id}, an event type's {name}."""

    id: int | None
    name: str | None


NO_PATH_PARAMS = PathParams(None, None)


def _header_text(request: Request, name: bytes) -> str | None:
    value = request.header(name)
    return None if value is None else value.decode("latin-1")


def request_hash(event_type: str, payload: bytes, destination_ids: list[int] | None,
                 ordering_key: str | None, channels: list[str] | None = None) -> bytes:
    """Identifies "the same request" for Idempotency-Key: the fields that make the event,
    the payload as its exact bytes. Channels join the hashed fields only when given, so a
    request without them hashes as it did before channels existed."""
    fields: list[object] = [event_type, destination_ids, ordering_key]
    if channels:
        fields.append(channels)
    head = encoder.encode(fields)
    return hashlib.sha256(head + b"\n" + payload).digest()


class IngressApp(DestinationApi, ConsoleApi, TenantApi, EventTypeApi, PortalApi):
    """The ASGI callable. Opens its pool, committer, key ring and event-type catalog on
    lifespan startup. The destination handlers are in destinations_api.py, the tenant and
    key handlers in tenants_api.py, the catalog's in event_types_api.py, the console's
    page and reads in console/api.py, the portal's links and page in portal.py."""

    def __init__(self, settings: Settings, dsn: str) -> None:
        self.settings = settings
        self.dsn = dsn
        self.token = settings.api_token.encode() if settings.api_token else None
        self.meters = IngressMetrics()
        self.gate = DatabaseGate(dsn)
        self.keys = KeyRing(self.token, self._connection)
        self.catalog = EventTypeCatalog(self._connection, settings.strict_event_types)
        self.committer: Committer | None = None
        self.openapi_document = encoder.encode(build_document(settings.max_timeout_ms))
        # Fixed paths by dictionary lookup; only paths with an {id} or a {name} need a
        # regex. A path under /v1/tenants/{tenant}/ is routed as its operation's own path
        # (_route).
        self.fixed_routes: dict[str, list[tuple[Operation, Handler]]] = {}
        self.param_routes: list[tuple[Operation, Handler]] = []
        for op in OPERATIONS:
            if "{id}" in op.path or "{name}" in op.path:
                self.param_routes.append((op, getattr(self, op.id)))
            else:
                self.fixed_routes.setdefault(op.path, []).append((op, getattr(self, op.id)))

    # ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        route = "unmatched"
        try:
            operation, handler, params, tenant_reference = self._route(scope)
            route = operation.id
            request = Request(scope, receive, params.id, self.settings.max_body_bytes,
                              path_name=params.name, tenant_ref=tenant_reference)
            if operation.auth:
                caller = await self._caller(scope)
                self._check_access(operation, caller)
                request.tenant = await self._tenant_of(caller, tenant_reference)
                request.caller = caller
            response = await handler(request)
        except ApiError as exc:
            response = Response(exc.status, exc.body(), exc.headers or JSON_HEADERS)
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout):
            # Not logged per request: the gate logs each outage once (engine/oplog.Outage).
            error = errors.unavailable()
            response = Response(error.status, error.body(), JSON_HEADERS)
        except Exception:
            log.exception("unhandled error in %s %s", scope["method"], scope["path"])
            error = errors.internal()
            response = Response(error.status, error.body(), JSON_HEADERS)
        headers = response.headers or []
        if response.status != 204:
            # A length, not chunked encoding: less to frame and for the client to parse.
            headers = [*headers, (b"content-length", b"%d" % len(response.body))]
        await send({"type": "http.response.start", "status": response.status,
                    "headers": headers})
        await send({"type": "http.response.body", "body": response.body})
        self.meters.observe(route, response.status, time.perf_counter() - started)

    def _route(self, scope: dict[str, Any]) -> tuple[Operation, Handler, PathParams, str | None]:
        """The operation a request names, its {id} or {name}, and its {tenant} as given. A
        path under /v1/tenants/{tenant}/ is a tenant's own route (keys, the tenant itself)
        or a tenant-scoped operation's path after /v1."""
        path: str = scope["path"]
        if path.startswith(_PORTAL_PREFIX):
            reference = path.removeprefix(_PORTAL_PREFIX)
            if not _TENANT_REFERENCE.fullmatch(reference):
                raise errors.not_found("path")
            return (*self._match(PORTAL_PAGE_PATH, scope["method"]), reference)
        if not path.startswith(_TENANTS_PREFIX):
            return (*self._match(path, scope["method"]), None)
        reference, _, rest = path.removeprefix(_TENANTS_PREFIX).partition("/")
        if not _TENANT_REFERENCE.fullmatch(reference):
            raise errors.not_found("path")
        if rest == "" or rest.partition("/")[0] in _TENANT_OWN_ROUTES:
            inner = TENANT_PATH + ("/" + rest if rest else "")
            return (*self._match(inner, scope["method"]), reference)
        operation, handler, params = self._match("/v1/" + rest, scope["method"])
        if not operation.tenant_scoped:
            raise errors.not_found("path")
        return operation, handler, params, reference

    def _match(self, path: str, method: str) -> tuple[Operation, Handler, PathParams]:
        allowed: list[str] = []
        fixed = self.fixed_routes.get(path)
        if fixed is not None:
            for operation, handler in fixed:
                if operation.method == method:
                    return operation, handler, NO_PATH_PARAMS
                allowed.append(operation.method)
        for operation, handler in () if fixed else self.param_routes:
            match = operation.pattern.match(path)
            if match is None:
                continue
            if operation.method != method:
                allowed.append(operation.method)
                continue
            found = match.groupdict()
            path_id = int(found["id"]) if "id" in found else None
            if path_id is not None and path_id > s.MAX_ID:
                raise errors.not_found()
            return operation, handler, PathParams(path_id, found.get("name"))
        if allowed:
            raise errors.method_not_allowed(method, allowed)
        raise errors.not_found("path")

    async def _caller(self, scope: dict[str, Any]) -> Caller:
        """The admin token or a live tenant key (engine/ingress/keys.py), else 401. With no
        ENGINE_API_TOKEN set every caller is the admin, but a key given is still its
        tenant's."""
        authorization = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value
        caller = await self.keys.caller(authorization)
        if caller is not None:
            return caller
        if self.token is None and (authorization is None
                                   or b" ek_" not in authorization):
            return ADMIN
        raise errors.unauthorized()

    @staticmethod
    def _check_access(operation: Operation, caller: Caller) -> None:
        if caller.admin:
            return
        if operation.access == "admin":
            raise errors.forbidden("this route is the admin token's alone")
        if caller.tenant_disabled:
            raise errors.forbidden("the tenant is disabled")
        if operation.access not in caller.scopes:
            if caller.portal is not None:
                raise errors.forbidden("this portal link is read-only" if caller.portal.read_only
                                       else "a portal link cannot do this")
            raise errors.forbidden(f"the key lacks the {operation.access!r} scope")

    async def _tenant_of(self, caller: Caller, reference: str | None) -> TenantScope:
        """The tenant a request acts for. A key reaches its own tenant only: any other
        tenant in the path is 404, as if it did not exist."""
        if caller.tenant is not None:
            if reference is None or reference in (caller.tenant.uid, str(caller.tenant.id)):
                return caller.tenant
            if caller.portal is not None:  # the link's holder knows which tenant it is for
                raise ApiError(401, "unauthorized", OTHER_TENANT)
            raise errors.not_found("tenant")
        if reference is None:
            return DEFAULT_SCOPE
        params = TenantFindParams(
            tenant_reference=reference,
            tenant_reference_id=int(reference) if reference.isdigit()
            and len(reference) <= 18 else None)
        async with self._connection() as conn:
            row = await (await queries.TENANT_FIND.run(conn, params)).fetchone()
        if row is None:
            raise errors.not_found("tenant")
        return TenantScope(row[0], row[1])

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                # What exists now (modules, the app, its pool) lives as long as the
                # process: keep it out of every later collection. A full collection
                # otherwise walks all of it, 20-25 ms during which no request is answered.
                gc.freeze()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        await self.gate.open()
        self.committer = Committer(self.dsn, gate=self.gate)
        self.committer.on_commit.append(self.meters.observe_commit)
        self.committer.start()
        self.keys.start()
        self.catalog.start()

    async def shutdown(self) -> None:
        await self.keys.stop()
        await self.catalog.stop()
        if self.committer is not None:
            await self.committer.stop()
        await self.gate.close()

    def _connection(self) -> Any:
        return self.gate.connection()

    # Events ----------------------------------------------------------------------------

    def _event_in(
        self, request: Request, event: s.EventCreate | s.BatchEventCreate,
        idempotency_key: str | None,
    ) -> EventIn:
        """The event to commit. Its `traceparent` header (one for every event of a batch)
        is kept when well formed and dropped when not: the parent of its attempts' spans
        (docs/decisions/0035)."""
        if event.type.startswith(RESERVED_EVENT_PREFIX):
            raise errors.invalid(
                f"type: types starting with {RESERVED_EVENT_PREFIX!r} are reserved for the"
                " engine's operational events")
        payload = bytes(event.payload)
        channels = channel_list(event.channels)
        return EventIn(
            type=event.type,
            payload=payload.decode("utf-8"),
            destination_ids=event.destination_ids,
            ordering_key=event.ordering_key,
            idempotency_key=idempotency_key,
            request_hash=request_hash(
                event.type, payload, event.destination_ids, event.ordering_key, channels
            ) if idempotency_key is not None else None,
            tenant_id=request.tenant.id,
            channels=channels,
            traceparent=checked_traceparent(_header_text(request, b"traceparent")),
        )

    async def _commit(self, events: list[EventIn]) -> list[s.EventAccepted]:
        assert self.committer is not None
        return await self.committer.submit(events)

    async def create_event(self, request: Request) -> Response:
        key_header = request.header(b"idempotency-key")
        key = None
        if key_header is not None:
            key = key_header.decode("latin-1")
            if not 1 <= len(key) <= 256:
                raise errors.invalid("Idempotency-Key: must be 1 to 256 characters")
        body: s.EventCreate = await request.decode(s.EventCreate)
        event = self._event_in(request, body, key)
        await self.catalog.admit(body.type, bytes(body.payload), "")
        accepted = await self._commit([event])
        return json_response(202, accepted[0])

    async def send_test_event(self, request: Request) -> Response:
        """A real event (in the event log, signed, retried and replayable as any) to the
        path's destination alone, so a receiver can be tried from the console or the
        portal before real traffic."""
        assert request.path_id is not None
        body: s.TestEventCreate = await request.decode(s.TestEventCreate)
        async with self._connection() as conn:
            if await store.read_destination(conn, request.tenant, request.path_id) is None:
                raise errors.not_found("destination")
            given = body.payload
            if given is msgspec.UNSET:
                row = await (await queries.EVENT_TYPE_READ.run(
                    conn, EventTypeParams(name=body.type))).fetchone()
                given = row[3] if row and row[3] is not None else {}
        payload = msgspec.Raw(encoder.encode(given))
        event = s.EventCreate(body.type, payload, destination_ids=[request.path_id])
        committed = self._event_in(request, event, None)
        await self.catalog.admit(body.type, bytes(payload), "")
        accepted = await self._commit([committed])
        return json_response(202, accepted[0])

    async def create_event_batch(self, request: Request) -> Response:
        if request.header(b"idempotency-key") is not None:
            raise errors.invalid(
                "Idempotency-Key: give each event its own idempotency_key in a batch"
            )
        limit = request.max_body_bytes
        request.max_body_bytes = limit * BATCH_BODY_FACTOR
        body: s.EventBatch = await request.decode(s.EventBatch)
        for index, event in enumerate(body.events):
            if len(event.payload) > limit:
                raise ApiError(413, "payload_too_large",
                               f"events[{index}].payload is over {limit} bytes")
        events = [self._event_in(request, event, event.idempotency_key)
                  for event in body.events]
        for index, event in enumerate(body.events):
            await self.catalog.admit(event.type, bytes(event.payload), f"events[{index}].")
        return json_response(202, s.BatchAccepted(await self._commit(events)))

    async def read_event(self, request: Request) -> Response:
        return await self._read_by_path_id(request, store.read_event, "event")

    async def delete_event_payload(self, request: Request) -> Response:
        assert request.path_id is not None
        async with self._connection() as conn:
            removed = await store.delete_event_payload(conn, request.tenant, request.path_id)
        if removed is None:
            raise errors.not_found("event")
        if not removed:
            raise errors.conflict("a delivery of the event is pending or in flight: its"
                                  " payload is still to be sent")
        return Response(204)

    # Deliveries ------------------------------------------------------------------------

    async def list_deliveries(self, request: Request) -> Response:
        params = request.query({"destination_id", "status", "limit", "after", "event_type",
                                "since", "until"})
        destination_id = int_param(params, "destination_id", 1, s.MAX_ID)
        status = params.get("status")
        if status is not None and status not in ("pending", "in_flight", "delivered", "dead"):
            raise errors.invalid("status: must be pending, in_flight, delivered or dead")
        limit = int_param(params, "limit", 1, s.MAX_LIST_LIMIT) or s.DEFAULT_LIST_LIMIT
        before_id = cursor_param(params)
        # The console's filters (event type, time, dead ones) have statements of their own.
        rows = await self.console_deliveries(
            request.tenant, params, destination_id, status, before_id, limit)
        if rows is None:
            async with self._connection() as conn:
                rows = await store.list_deliveries(
                    conn, request.tenant, destination_id, status, before_id, limit
                )
        next_cursor = str(rows[-1].id) if len(rows) == limit else None
        return json_response(200, s.DeliveryPage(rows, next_cursor))

    async def read_delivery(self, request: Request) -> Response:
        return await self._read_by_path_id(request, store.read_delivery, "delivery")

    async def replay_delivery(self, request: Request) -> Response:
        assert request.path_id is not None
        async with self._connection() as conn:
            replayed = await queue_async.replay_delivery(conn, request.tenant.id, request.path_id)
            delivery = await store.read_delivery_row(conn, request.tenant, request.path_id)
        if delivery is None:
            raise errors.not_found("delivery")
        if not replayed:
            raise errors.conflict("the delivery is in flight (replay it once it finishes), or"
                                  " its event's payload was removed")
        return json_response(202, delivery)

    # Operations ------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        try:
            async with self._connection() as conn:
                await queries.SESSION_ALIVE.run(conn)
        except (ApiError, psycopg.Error, psycopg_pool.PoolTimeout):
            raise errors.unavailable("the database is unreachable") from None
        return json_response(200, s.Health("ok", "ok"))

    async def metrics(self, request: Request) -> Response:
        # Every process's metrics plus gauges read from the database (engine/observe/metrics.py);
        # in a thread, since the database part is a blocking query.
        body = await asyncio.to_thread(engine_metrics.render, self.dsn, self.meters.registry)
        return Response(200, body, [(b"content-type", engine_metrics.CONTENT_TYPE.encode())])

    async def openapi(self, request: Request) -> Response:
        return Response(200, self.openapi_document, JSON_HEADERS)

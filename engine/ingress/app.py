"""The ingress ASGI application: routing, auth, body limits, validation and the handlers.

uvicorn parses HTTP; this module sees ASGI scopes. Each operation declared in openapi.py
is bound to one handler here; requests are decoded by the msgspec types of schemas.py.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import msgspec
import psycopg
import psycopg_pool
from msgspec import UNSET

from engine import metrics as engine_metrics
from engine import queue
from engine.config import Settings
from engine.destination_options import (
    OptionError,
    check_headers,
    check_rate_limit,
    check_retry_schedule,
)
from engine.domain import EventIn
from engine.ingress import errors, store
from engine.ingress import schemas as s
from engine.ingress.committer import Committer
from engine.ingress.console_api import ConsoleApi
from engine.ingress.dbgate import DatabaseGate
from engine.ingress.errors import ApiError
from engine.ingress.metrics import IngressMetrics
from engine.ingress.openapi import OPERATIONS, Operation, build_document
from engine.operational_events import RESERVED_EVENT_PREFIX
from engine.signing import generate_secret, secret_key
from engine.targets import TargetError, validate_url

log = logging.getLogger(__name__)

# How long the previous secret keeps signing after a rotation (SPEC: 24 h by default).
PREVIOUS_SECRET_MS = 24 * 3600 * 1000
# A batch carries up to 1000 events: its body may be this many times the per-request
# limit, while each event's payload still keeps to the limit itself.
BATCH_BODY_FACTOR = 32
JSON_HEADERS = [(b"content-type", b"application/json")]

_encoder = msgspec.json.Encoder()
_decoders: dict[type, msgspec.json.Decoder[Any]] = {}


@dataclass
class Request:
    scope: dict[str, Any]
    receive: Callable[[], Awaitable[dict[str, Any]]]
    path_id: int | None
    max_body_bytes: int

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.scope["headers"]:
            if key == name:
                return value
        return None

    async def body(self) -> bytes:
        """The whole body, refusing (413) as soon as it is over the limit."""
        declared = self.header(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise errors.too_large(self.max_body_bytes)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ApiError(400, "disconnected", "client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise errors.too_large(self.max_body_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def decode(self, model: type[Any]) -> Any:
        body = await self.body()
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            raise errors.bad_json("request body is not valid UTF-8") from None
        decoder = _decoders.get(model)
        if decoder is None:
            decoder = _decoders[model] = msgspec.json.Decoder(model)
        try:
            return decoder.decode(body)
        except msgspec.ValidationError as exc:
            raise errors.invalid(str(exc)) from None
        except msgspec.DecodeError as exc:
            raise errors.bad_json(str(exc)) from None
        except RecursionError:
            # msgspec decodes nested values recursively, within Python's recursion limit
            # (about 1,000 levels here): deeper is refused, whole, before anything is done.
            raise errors.bad_json(
                "request body is nested too deeply (arrays and objects within each other)"
            ) from None

    def query(self, allowed: set[str]) -> dict[str, str]:
        raw = self.scope.get("query_string", b"")
        try:
            pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                              errors="strict")
        except UnicodeDecodeError:
            raise errors.invalid("query string is not valid UTF-8") from None
        params: dict[str, str] = {}
        for name, value in pairs:
            if name not in allowed:
                raise errors.invalid(f"unknown query parameter {name!r}")
            if name in params:
                raise errors.invalid(f"query parameter {name!r} given twice")
            params[name] = value
        return params


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[bytes, bytes]] | None = None


Handler = Callable[[Request], Awaitable[Response]]


def _json(status: int, value: Any) -> Response:
    return Response(status, _encoder.encode(value), JSON_HEADERS)


def request_hash(event_type: str, payload: bytes, destination_ids: list[int] | None,
                 ordering_key: str | None) -> bytes:
    """Identifies "the same request" for Idempotency-Key: the fields that make the event,
    the payload as its exact bytes."""
    head = _encoder.encode([event_type, destination_ids, ordering_key])
    return hashlib.sha256(head + b"\n" + payload).digest()


def _int_param(params: dict[str, str], name: str, low: int, high: int) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or not low <= int(value) <= high:
        raise errors.invalid(f"{name}: must be an integer from {low} to {high}")
    return int(value)


class IngressApp(ConsoleApi):
    """The ASGI callable. Opens its pool and committer on lifespan startup. The console's
    page and reads are in console_api.py."""

    def __init__(self, settings: Settings, dsn: str) -> None:
        self.settings = settings
        self.dsn = dsn
        self.token = settings.api_token.encode() if settings.api_token else None
        self.meters = IngressMetrics()
        self.gate = DatabaseGate(dsn)
        self.committer: Committer | None = None
        self.openapi_document = _encoder.encode(build_document(settings.max_timeout_ms))
        # Fixed paths by dictionary lookup; only paths with an {id} need a regex.
        self.fixed_routes: dict[str, list[tuple[Operation, Handler]]] = {}
        self.id_routes: list[tuple[Operation, Handler]] = []
        for op in OPERATIONS:
            if "{" in op.path:
                self.id_routes.append((op, getattr(self, op.id)))
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
            operation, handler, path_id = self._route(scope)
            route = operation.id
            if operation.auth:
                self._authorize(scope)
            response = await handler(Request(scope, receive, path_id, self.settings.max_body_bytes))
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

    def _route(self, scope: dict[str, Any]) -> tuple[Operation, Handler, int | None]:
        path: str = scope["path"]
        method: str = scope["method"]
        allowed: list[str] = []
        fixed = self.fixed_routes.get(path)
        if fixed is not None:
            for operation, handler in fixed:
                if operation.method == method:
                    return operation, handler, None
                allowed.append(operation.method)
        for operation, handler in () if fixed else self.id_routes:
            match = operation.pattern.match(path)
            if match is None:
                continue
            if operation.method != method:
                allowed.append(operation.method)
                continue
            path_id = int(match["id"])
            if path_id > s.MAX_ID:
                raise errors.not_found()
            return operation, handler, path_id
        if allowed:
            raise errors.method_not_allowed(method, allowed)
        raise errors.not_found("path")

    def _authorize(self, scope: dict[str, Any]) -> None:
        if self.token is None:
            return
        for key, value in scope["headers"]:
            if key == b"authorization":
                scheme, _, given = value.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token):
                    return
        raise errors.unauthorized()

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

    async def shutdown(self) -> None:
        if self.committer is not None:
            await self.committer.stop()
        await self.gate.close()

    def _connection(self) -> Any:
        return self.gate.connection()

    # Destinations ----------------------------------------------------------------------

    def _check_url(self, url: str) -> str:
        try:
            return validate_url(url, self.settings.target_allowance)
        except (TargetError, ValueError) as exc:
            raise errors.invalid(f"url: {exc}") from None

    def _check_timeout(self, timeout_ms: int) -> int:
        if not 1 <= timeout_ms <= self.settings.max_timeout_ms:
            raise errors.invalid(
                f"timeout_ms: must be from 1 to {self.settings.max_timeout_ms}"
            )
        return timeout_ms

    def _check_options(
        self, body: s.DestinationCreate | s.DestinationPatch
    ) -> store.DeliveryOptions:
        """The per-destination delivery options of a request, validated; UNSET stays UNSET
        (a PATCH leaves those columns alone)."""
        options = store.DeliveryOptions()
        try:
            if body.rate_limit is not UNSET:
                options.rate_limit = (
                    None if body.rate_limit is None else check_rate_limit(body.rate_limit))
            if body.headers is not UNSET:
                options.headers = None if body.headers is None else check_headers(body.headers)
            if body.retry_schedule is not UNSET:
                options.retry_schedule = (
                    None if body.retry_schedule is None
                    else check_retry_schedule(body.retry_schedule))
        except OptionError as exc:
            raise errors.invalid(str(exc)) from None
        return options

    async def create_destination(self, request: Request) -> Response:
        body: s.DestinationCreate = await request.decode(s.DestinationCreate)
        url = self._check_url(body.url)
        if body.secret is None:
            secret = generate_secret()
        else:
            try:
                secret_key(body.secret)
            except ValueError as exc:
                raise errors.invalid(f"secret: {exc}") from None
            secret = body.secret
        timeout_ms = self._check_timeout(
            body.timeout_ms if body.timeout_ms is not None else self.settings.default_timeout_ms
        )
        options = self._check_options(body)
        async with self._connection() as conn:
            destination = await store.create_destination(
                conn, url, secret, body.event_types, body.max_in_flight, body.ordered,
                timeout_ms, options,
            )
        return _json(201, destination)

    async def list_destinations(self, request: Request) -> Response:
        request.query(set())
        async with self._connection() as conn:
            destinations = await store.list_destinations(conn)
        return _json(200, s.DestinationList(destinations))

    async def read_destination(self, request: Request) -> Response:
        assert request.path_id is not None
        async with self._connection() as conn:
            destination = await store.read_destination(conn, request.path_id)
        if destination is None:
            raise errors.not_found("destination")
        return _json(200, destination)

    async def patch_destination(self, request: Request) -> Response:
        assert request.path_id is not None
        body: s.DestinationPatch = await request.decode(s.DestinationPatch)
        url = None if body.url is UNSET else self._check_url(body.url)
        timeout_ms = None if body.timeout_ms is UNSET else self._check_timeout(body.timeout_ms)
        new_secret = generate_secret() if body.rotate_secret is True else None
        options = self._check_options(body)
        async with self._connection() as conn:
            destination = await store.patch_destination(
                conn, request.path_id, url=url,
                set_event_types=body.event_types is not UNSET,
                event_types=None if body.event_types is UNSET else body.event_types,
                set_max_in_flight=body.max_in_flight is not UNSET,
                max_in_flight=None if body.max_in_flight is UNSET else body.max_in_flight,
                ordered=None if body.ordered is UNSET else body.ordered,
                timeout_ms=timeout_ms,
                paused=None if body.paused is UNSET else body.paused,
                disabled=None if body.disabled is UNSET else body.disabled,
                new_secret=new_secret, previous_secret_ms=PREVIOUS_SECRET_MS,
                options=options,
            )
        if destination is None:
            raise errors.not_found("destination")
        return _json(200, destination)

    async def delete_destination(self, request: Request) -> Response:
        assert request.path_id is not None
        async with self._connection() as conn:
            deleted = await store.delete_destination(conn, request.path_id)
        if not deleted:
            raise errors.not_found("destination")
        return Response(204)

    async def replay_destination(self, request: Request) -> Response:
        assert request.path_id is not None
        body: s.ReplayDead = await request.decode(s.ReplayDead)
        async with self._connection() as conn:
            if await store.read_destination(conn, request.path_id) is None:
                raise errors.not_found("destination")
            replayed = await queue.replay_dead_async(conn, request.path_id, body.since)
        return _json(202, s.ReplayAccepted(replayed))

    # Events ----------------------------------------------------------------------------

    def _event_in(
        self, event: s.EventCreate | s.BatchEventCreate, idempotency_key: str | None
    ) -> EventIn:
        if event.type.startswith(RESERVED_EVENT_PREFIX):
            raise errors.invalid(
                f"type: types starting with {RESERVED_EVENT_PREFIX!r} are reserved for the"
                " engine's operational events")
        payload = bytes(event.payload)
        return EventIn(
            type=event.type,
            payload=payload.decode("utf-8"),
            destination_ids=event.destination_ids,
            ordering_key=event.ordering_key,
            idempotency_key=idempotency_key,
            request_hash=request_hash(
                event.type, payload, event.destination_ids, event.ordering_key
            ) if idempotency_key is not None else None,
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
        accepted = await self._commit([self._event_in(body, key)])
        return _json(202, accepted[0])

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
        events = [self._event_in(event, event.idempotency_key) for event in body.events]
        return _json(202, s.BatchAccepted(await self._commit(events)))

    async def read_event(self, request: Request) -> Response:
        assert request.path_id is not None
        async with self._connection() as conn:
            event = await store.read_event(conn, request.path_id)
        if event is None:
            raise errors.not_found("event")
        return _json(200, event)

    # Deliveries ------------------------------------------------------------------------

    async def list_deliveries(self, request: Request) -> Response:
        params = request.query({"destination_id", "status", "limit", "after", "event_type",
                                "since", "until"})
        destination_id = _int_param(params, "destination_id", 1, s.MAX_ID)
        status = params.get("status")
        if status is not None and status not in ("pending", "in_flight", "delivered", "dead"):
            raise errors.invalid("status: must be pending, in_flight, delivered or dead")
        limit = _int_param(params, "limit", 1, s.MAX_LIST_LIMIT) or s.DEFAULT_LIST_LIMIT
        after = params.get("after")
        before_id = None
        if after is not None:
            if not after.isascii() or not after.isdigit() or len(after) > 19:
                raise errors.invalid("after: not a cursor returned by this endpoint")
            before_id = min(int(after), s.MAX_ID)
        # The console's filters (event type, time, dead ones) have statements of their own.
        rows = await self.console_deliveries(params, destination_id, status, before_id, limit)
        if rows is None:
            async with self._connection() as conn:
                rows = await store.list_deliveries(
                    conn, destination_id, status, before_id, limit
                )
        next_cursor = str(rows[-1].id) if len(rows) == limit else None
        return _json(200, s.DeliveryPage(rows, next_cursor))

    async def read_delivery(self, request: Request) -> Response:
        assert request.path_id is not None
        async with self._connection() as conn:
            delivery = await store.read_delivery(conn, request.path_id)
        if delivery is None:
            raise errors.not_found("delivery")
        return _json(200, delivery)

    async def replay_delivery(self, request: Request) -> Response:
        assert request.path_id is not None
        async with self._connection() as conn:
            replayed = await queue.replay_delivery_async(conn, request.path_id)
            delivery = await store.read_delivery_row(conn, request.path_id)
        if delivery is None:
            raise errors.not_found("delivery")
        if not replayed:
            raise errors.conflict("the delivery is in flight; replay it once it finishes")
        return _json(202, delivery)

    # Operations ------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        try:
            async with self._connection() as conn:
                await conn.execute("SELECT 1")
        except (ApiError, psycopg.Error, psycopg_pool.PoolTimeout):
            raise errors.unavailable("the database is unreachable") from None
        return _json(200, s.Health("ok", "ok"))

    async def metrics(self, request: Request) -> Response:
        # Every process's metrics plus gauges read from the database (engine/metrics.py);
        # in a thread, since the database part is a blocking query.
        body = await asyncio.to_thread(engine_metrics.render, self.dsn, self.meters.registry)
        return Response(200, body, [(b"content-type", engine_metrics.CONTENT_TYPE.encode())])

    async def openapi(self, request: Request) -> Response:
        return Response(200, self.openapi_document, JSON_HEADERS)

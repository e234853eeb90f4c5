"""The ingress app's HTTP plumbing: a request as its handlers see it (body limits, JSON
decoding by msgspec type, query parameters), the response they return, and the JSON
helpers every handler module shares (app.py, destinations_api.py, console/api.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import msgspec

from engine.domain import DEFAULT_TENANT_ID
from engine.ingress import errors
from engine.ingress.errors import ApiError

JSON_HEADERS = [(b"content-type", b"application/json")]

encoder = msgspec.json.Encoder()
_decoders: dict[type, msgspec.json.Decoder[Any]] = {}


@dataclass(frozen=True)
class TenantScope:
    """The tenant a request acts for: named in its path (/v1/tenants/{tenant}/…), or its
    key's tenant, or `default` for the admin token on an unscoped path. Every store
    function takes it, and every statement binds its id."""

    id: int
    uid: str


DEFAULT_SCOPE = TenantScope(DEFAULT_TENANT_ID, "default")


@dataclass
class Request:
    scope: dict[str, Any]
    receive: Callable[[], Awaitable[dict[str, Any]]]
    path_id: int | None
    max_body_bytes: int
    # The path's {name} (an event type's), when it has one.
    path_name: str | None = None
    tenant: TenantScope = DEFAULT_SCOPE
    # The tenant path segment as given (an id or a uid): /v1/tenants/{tenant}/…, /portal/{tenant}.
    tenant_ref: str | None = None
    caller: Any = None  # keys.Caller of an authenticated request (None: a route without auth)

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


def json_response(status: int, value: Any) -> Response:
    return Response(status, encoder.encode(value), JSON_HEADERS)


def int_param(params: dict[str, str], name: str, low: int, high: int) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or not low <= int(value) <= high:
        raise errors.invalid(f"{name}: must be an integer from {low} to {high}")
    return int(value)

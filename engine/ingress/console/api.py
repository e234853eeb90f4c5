"""The console's side of ingress: the static page (GET /console and its two files) and the
read endpoints it needs beyond the core API (events list, destination stats, overview,
deliveries by event type or time). IngressApp inherits these handlers; openapi.py declares
their operations like every other."""

from __future__ import annotations

import datetime as dt
from importlib import resources
from typing import Annotated, Any

import msgspec

from engine.ingress import errors, store
from engine.ingress import schemas as s
from engine.ingress.console import store as console_store
from engine.ingress.http import Request, Response, TenantScope, int_param, json_response
from engine.webhooks.retry import parse_duration

DEFAULT_WINDOW_S = 3600.0
MAX_WINDOW_S = 24 * 3600.0
STATUSES = ("pending", "in_flight", "delivered", "dead")
_AwareDatetime = Annotated[dt.datetime, msgspec.Meta(tz=True)]

# The page is ours alone: scripts and styles only from this origin, no inline script, no
# framing (but the portal's, by --portal-frame-ancestors: portal.py), nothing sent
# elsewhere. Data is rendered with textContent, and this policy is the second line should
# a value ever reach the DOM as markup.
def page_security_headers(frame_ancestors: bytes = b"'none'") -> list[tuple[bytes, bytes]]:
    return [
        (b"content-security-policy",
         b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
         b" connect-src 'self'; frame-ancestors " + frame_ancestors
         + b"; base-uri 'none'; form-action 'none'"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"cache-control", b"no-cache"),
    ]


_ASSETS = {
    "console.html": b"text/html; charset=utf-8",
    "console.js": b"text/javascript; charset=utf-8",
    "console_pages.js": b"text/javascript; charset=utf-8",
    "console.css": b"text/css; charset=utf-8",
}


def _load_assets() -> dict[str, tuple[bytes, list[tuple[bytes, bytes]]]]:
    folder = resources.files("engine.ingress.console") / "static"
    return {
        name: ((folder / name).read_bytes(), [(b"content-type", kind), *page_security_headers()])
        for name, kind in _ASSETS.items()
    }


def time_param(params: dict[str, str], name: str) -> dt.datetime | None:
    value = params.get(name)
    if value is None:
        return None
    try:
        return msgspec.convert(value, _AwareDatetime)
    except msgspec.ValidationError:
        raise errors.invalid(
            f"{name}: must be an RFC 3339 time with a zone, like 2026-01-31T12:00:00Z"
        ) from None


def window_param(params: dict[str, str]) -> float:
    value = params.get("window")
    if value is None:
        return DEFAULT_WINDOW_S
    try:
        seconds = parse_duration(value)
    except ValueError:
        seconds = 0.0
    if not 1 <= seconds <= MAX_WINDOW_S:
        raise errors.invalid("window: must be a duration from 1s to 24h, like 15m or 1h")
    return seconds


def cursor_param(params: dict[str, str]) -> int | None:
    after = params.get("after")
    if after is None:
        return None
    if not after.isascii() or not after.isdigit() or len(after) > 19:
        raise errors.invalid("after: not a cursor returned by this endpoint")
    return min(int(after), s.MAX_ID)


def text_param(params: dict[str, str], name: str) -> str | None:
    value = params.get(name)
    if value is not None and not (1 <= len(value) <= 256 and "\x00" not in value):
        raise errors.invalid(f"{name}: must be 1 to 256 characters")
    return value


class ConsoleApi:
    """Handlers mixed into IngressApp (which provides _connection)."""

    _console_assets: dict[str, tuple[bytes, list[tuple[bytes, bytes]]]] | None = None

    def _connection(self) -> Any:
        raise NotImplementedError

    def _asset(self, name: str) -> Response:
        if self._console_assets is None:
            self._console_assets = _load_assets()
        body, headers = self._console_assets[name]
        return Response(200, body, headers)

    async def console_page(self, request: Request) -> Response:
        return self._asset("console.html")

    async def console_script(self, request: Request) -> Response:
        return self._asset("console.js")

    async def console_pages_script(self, request: Request) -> Response:
        return self._asset("console_pages.js")

    async def console_style(self, request: Request) -> Response:
        return self._asset("console.css")

    async def list_events(self, request: Request) -> Response:
        params = request.query({"type", "since", "until", "limit", "after"})
        event_type = text_param(params, "type")
        since, until = time_param(params, "since"), time_param(params, "until")
        limit = (int_param(params, "limit", 1, s.MAX_LIST_LIMIT)
                 or s.DEFAULT_LIST_LIMIT)
        after = cursor_param(params)
        async with self._connection() as conn:
            rows = await console_store.list_events(
                conn, request.tenant, event_type, since, until, after, limit)
        next_cursor = str(rows[-1].id) if len(rows) == limit else None
        return json_response(200, s.EventPage(rows, next_cursor))

    async def destination_stats(self, request: Request) -> Response:
        assert request.path_id is not None
        params = request.query({"window", "dead_since"})
        window_s = window_param(params)
        dead_since = time_param(params, "dead_since")
        async with self._connection() as conn:
            if await store.read_destination(conn, request.tenant, request.path_id) is None:
                raise errors.not_found("destination")
            stats = await console_store.destination_stats(
                conn, request.path_id, window_s, dead_since
            )
        return json_response(200, stats)

    async def overview(self, request: Request) -> Response:
        window_s = window_param(request.query({"window"}))
        async with self._connection() as conn:
            return json_response(200, await console_store.overview(conn, window_s))

    async def console_deliveries(
        self, tenant: TenantScope, params: dict[str, str], destination_id: int | None,
        status: str | None, after: int | None, limit: int,
    ) -> list[s.Delivery] | None:
        """GET /v1/deliveries with event_type, since or until, or for dead ones; None when
        the core listing (store.list_deliveries) serves the query."""
        by_event = bool(params.keys() & {"event_type", "since", "until"})
        if not by_event and status != "dead":
            return None
        event_type = text_param(params, "event_type")
        since, until = time_param(params, "since"), time_param(params, "until")
        async with self._connection() as conn:
            if not by_event:
                return await console_store.list_dead(conn, tenant, destination_id, after, limit)
            return await console_store.list_deliveries_by_event(
                conn, tenant, event_type, since, until, status, destination_id, after, limit
            )

"""The destination handlers of the ingress API (create, list, read, patch, delete, replay
its dead deliveries), a mixin of IngressApp (app.py) as the console's reads are
(console/api.py): validation here, SQL in store.py and engine/sql/."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from engine.db import queue_async
from engine.ingress import errors, store
from engine.ingress import schemas as s
from engine.ingress.http import Request, Response, TenantScope, json_response
from engine.webhooks.destination_options import (
    OptionError,
    check_headers,
    check_rate_limit,
    check_retry_schedule,
)
from engine.webhooks.egress import (
    EgressError,
    check_client_secret,
    check_proxy,
    check_tls,
    check_token_url,
)
from engine.webhooks.routing import FilterError, channel_list, compile_filter
from engine.webhooks.signing import generate_secret, secret_key
from engine.webhooks.targets import TargetError, validate_url

if TYPE_CHECKING:
    from engine.config import Settings

# How long the previous secret keeps signing after a rotation (SPEC: 24 h by default).
PREVIOUS_SECRET_MS = 24 * 3600 * 1000


class DestinationApi:
    """Needs `settings` and `_connection()` from the app it is mixed into."""

    settings: Settings

    def _connection(self) -> Any:
        raise NotImplementedError

    async def _read_by_path_id(
        self, request: Request, read: Callable[[Any, TenantScope, int], Awaitable[Any]],
        what: str,
    ) -> Response:
        """GET of one resource (a destination, an event, a delivery): `read` it by the
        path's id, 404 when it does not exist."""
        assert request.path_id is not None
        async with self._connection() as conn:
            found = await read(conn, request.tenant, request.path_id)
        if found is None:
            raise errors.not_found(what)
        return json_response(200, found)

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
            if body.filter is not UNSET:
                options.filter = compile_filter(body.filter)
            if body.channels is not UNSET:
                options.channels = channel_list(body.channels)
            if body.propagate_trace is not UNSET:
                options.propagate_trace = body.propagate_trace
        except (OptionError, FilterError) as exc:
            raise errors.invalid(str(exc)) from None
        return options

    def _check_egress(
        self, body: s.DestinationCreate | s.DestinationPatch
    ) -> store.EgressSettings:
        """The egress settings of a request, validated (engine/webhooks/egress.py); UNSET
        stays UNSET. Nothing is written when one fails: this runs before the statement."""
        egress = store.EgressSettings()
        allowance = self.settings.target_allowance
        try:
            if isinstance(body.tls, s.TlsSettings):
                tls = check_tls(body.tls.client_cert, body.tls.client_key, body.tls.ca_bundle)
                egress.tls = (tls.client_cert, tls.client_key, tls.ca_bundle)
            elif body.tls is None:
                egress.tls = None
            if body.proxy is not UNSET:
                egress.proxy = None if body.proxy is None else check_proxy(body.proxy, allowance)
            if isinstance(body.auth, s.OAuth2ClientCredentials):
                auth = {"type": body.auth.type,
                        "token_url": check_token_url(body.auth.token_url, allowance),
                        "client_id": body.auth.client_id,
                        "client_secret": check_client_secret(body.auth.client_secret)}
                if body.auth.scope is not None:
                    auth["scope"] = body.auth.scope
                egress.auth = auth
            elif body.auth is None:
                egress.auth = None
        except EgressError as exc:
            raise errors.invalid(str(exc)) from None
        return egress

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
        egress = self._check_egress(body)
        async with self._connection() as conn:
            destination = await store.create_destination(
                conn, request.tenant, url, secret, body.event_types, body.max_in_flight,
                body.ordered, timeout_ms, options, egress,
            )
        return json_response(201, destination)

    async def list_destinations(self, request: Request) -> Response:
        request.query(set())
        async with self._connection() as conn:
            destinations = await store.list_destinations(conn, request.tenant)
        return json_response(200, s.DestinationList(destinations))

    async def read_destination(self, request: Request) -> Response:
        return await self._read_by_path_id(request, store.read_destination, "destination")

    async def patch_destination(self, request: Request) -> Response:
        assert request.path_id is not None
        body: s.DestinationPatch = await request.decode(s.DestinationPatch)
        url = None if body.url is UNSET else self._check_url(body.url)
        timeout_ms = None if body.timeout_ms is UNSET else self._check_timeout(body.timeout_ms)
        new_secret = generate_secret() if body.rotate_secret is True else None
        options = self._check_options(body)
        egress = self._check_egress(body)
        async with self._connection() as conn:
            destination = await store.patch_destination(
                conn, request.tenant, request.path_id, url=url,
                set_event_types=body.event_types is not UNSET,
                event_types=None if body.event_types is UNSET else body.event_types,
                set_max_in_flight=body.max_in_flight is not UNSET,
                max_in_flight=None if body.max_in_flight is UNSET else body.max_in_flight,
                ordered=None if body.ordered is UNSET else body.ordered,
                timeout_ms=timeout_ms,
                paused=None if body.paused is UNSET else body.paused,
                disabled=None if body.disabled is UNSET else body.disabled,
                new_secret=new_secret, previous_secret_ms=PREVIOUS_SECRET_MS,
                options=options, egress=egress,
            )
        if destination is None:
            raise errors.not_found("destination")
        return json_response(200, destination)

    async def delete_destination(self, request: Request) -> Response:
        assert request.path_id is not None
        async with self._connection() as conn:
            deleted = await store.delete_destination(conn, request.tenant, request.path_id)
        if not deleted:
            raise errors.not_found("destination")
        return Response(204)

    async def replay_destination(self, request: Request) -> Response:
        assert request.path_id is not None
        body: s.ReplayDead = await request.decode(s.ReplayDead)
        async with self._connection() as conn:
            if await store.read_destination(conn, request.tenant, request.path_id) is None:
                raise errors.not_found("destination")
            replayed = await queue_async.replay_dead(conn, request.path_id, body.since)
        return json_response(202, s.ReplayAccepted(replayed))

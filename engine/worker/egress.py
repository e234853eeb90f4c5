"""A worker's egress side (SPEC, "Egress"; docs/decisions/0034-egress.md): the egress
settings of the destinations it sends to, read once per egress revision, and their OAuth2
tokens, kept in the database for every process and host.

A claim without an egress revision never comes here (DeliveryWorker._send): no lookup,
no task, no database. One whose destination's settings are known and need no token
starts at once, as any other. The rest (the first claim of a revision, and every claim
of a destination with OAuth2) goes through a task: settings, token, POST, and on a 401
one refresh and one retry within the same attempt.

A token is refreshed once per worker at a time (`refreshing`), and ahead of its expiry:
past its refresh time a send still uses it while it lives, and starts the refresh in the
background. Sends never wait for a token a live one could replace; waiting, they would
leave together once it came, each on a new connection.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from engine.db import queries
from engine.db.sql_params import (
    DestinationEgressReadParams,
    OauthTokenLockParams,
    OauthTokenReadParams,
    OauthTokenStoreParams,
)
from engine.domain import Claim
from engine.webhooks.egress import EgressOptions
from engine.webhooks.oauth import (
    MAX_TOKEN_BYTES,
    TokenError,
    parse_token,
    refresh_after_s,
    token_request,
)
from engine.webhooks.targets import Allowance, Lookup
from engine.worker.http.client import CurlPool
from engine.worker.http.pools import CurlPools
from engine.worker.http.transfer import HttpResult, OnDone, failed_result

# pg_advisory_xact_lock(class, destination id) key space: "fetching this destination's
# OAuth2 token" (oauth_token_lock.sql). Its own class: the fetch holds it for a round trip
# to the token endpoint, which no claim or result write may wait for.
OAUTH_LOCK_CLASS = 0x656F61
TOKEN_TIMEOUT_MS = 10_000
# Connections a worker's egress side opens at most (settings reads, token fetches); none
# until a claim with an egress revision comes.
EGRESS_CONNECTIONS = 4


@dataclass(frozen=True)
class HeldToken:
    """A worker's copy of a destination's token (monotonic times)."""

    revision: int
    token: str
    usable_until: float  # then a refresh begins, in the background
    alive_until: float  # then sends wait for the next token


@dataclass(frozen=True)
class DestinationEgress:
    """One destination's egress settings at one revision, as a worker sends with them."""

    revision: int
    options: EgressOptions | None
    auth: dict[str, Any] | None


class OAuthFailed(Exception):
    """No token: the attempt fails as `oauth`."""


class EgressSide:
    def __init__(self, dsn: str, http: CurlPools, allowance: Allowance, lookup: Lookup,
                 egress_proxy: str | None, ca_bundle: bytes | None) -> None:
        self.dsn = dsn
        self.http = http
        self.allowance = allowance
        self.lookup = lookup
        self.ca_bundle = ca_bundle
        # The operator's --egress-proxy: every destination's requests go through it, unless
        # the destination has a proxy of its own.
        self.default = (EgressOptions(proxy=egress_proxy, proxy_trusted=True)
                        if egress_proxy else None)
        self.known: dict[int, DestinationEgress] = {}
        self.tokens: dict[int, HeldToken] = {}
        # destination id -> the fetch or read of its next token under way (one at a time)
        self.refreshing: dict[int, asyncio.Task[str]] = {}
        self.tasks: set[asyncio.Task[HttpResult]] = set()
        self._db: AsyncConnectionPool | None = None
        self._token_http: CurlPool | None = None

    # Sending

    def send(self, claim: Claim, headers: list[str], body: bytes, timeout_ms: int,
             on_done: OnDone) -> None:
        """Begin one POST of a claim with an egress revision; the result reaches
        `on_done` once, from the loop (None when the worker closed first)."""
        known = self.known.get(claim.destination_id)
        if known is not None and known.revision == claim.egress_revision and known.auth is None:
            self.http.start_checked(claim.url, headers, body, timeout_ms, self.allowance,
                                    on_done, known.options)
            return
        task = asyncio.get_running_loop().create_task(
            self._send(claim, headers, body, timeout_ms))
        self.tasks.add(task)
        task.add_done_callback(lambda done: self._done(done, on_done))

    def _done(self, task: asyncio.Task[HttpResult], on_done: OnDone) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            on_done(None)
        elif (exc := task.exception()) is not None:
            on_done(failed_result(f"internal: {exc!r}"[:300], time.time()))
        else:
            on_done(task.result())

    async def _send(self, claim: Claim, headers: list[str], body: bytes,
                    timeout_ms: int) -> HttpResult:
        started_at = time.time()
        egress = self.known.get(claim.destination_id)
        if egress is None or egress.revision != claim.egress_revision:
            egress = await self._settings(claim.destination_id)
        if egress.auth is None:
            return await self._post(claim.url, headers, body, timeout_ms, egress.options)
        try:
            token = await self._token(claim.destination_id, egress, stale=None)
            result = await self._post(claim.url, [*headers, f"authorization: Bearer {token}"],
                                      body, timeout_ms, egress.options)
            if result.status_code != 401:
                return result
            # Rejected: one refresh and one retry, within this attempt.
            token = await self._token(claim.destination_id, egress, stale=token)
            return await self._post(claim.url, [*headers, f"authorization: Bearer {token}"],
                                    body, timeout_ms, egress.options)
        except OAuthFailed:
            return failed_result("oauth", started_at)

    async def _post(self, url: str, headers: list[str], body: bytes, timeout_ms: int,
                    options: EgressOptions | None) -> HttpResult:
        future: asyncio.Future[HttpResult] = asyncio.get_running_loop().create_future()

        def settle(result: HttpResult | None) -> None:
            if future.done():
                return
            if result is None:
                future.cancel()
            else:
                future.set_result(result)

        self.http.start_checked(url, headers, body, timeout_ms, self.allowance, settle, options)
        return await future

    # Settings

    async def _database(self) -> AsyncConnectionPool:
        if self._db is None:
            self._db = AsyncConnectionPool(
                self.dsn, min_size=1, max_size=EGRESS_CONNECTIONS, open=False,
                kwargs={"autocommit": True, "application_name": "engine-egress"})
            await self._db.open()
        return self._db

    async def _settings(self, destination_id: int) -> DestinationEgress:
        pool = await self._database()
        async with pool.connection() as conn:
            row = await (await queries.DESTINATION_EGRESS_READ.run(
                conn, DestinationEgressReadParams(destination_id=destination_id))).fetchone()
        egress = self._build(row)
        self.known[destination_id] = egress
        return egress

    def _build(self, row: tuple | None) -> DestinationEgress:
        """Settings as sent with: a destination's own proxy, else the operator's."""
        if row is None or row[0] is None:
            return DestinationEgress(0, self.default, None)
        revision, cert, key, ca_bundle, proxy, auth = row
        if proxy is None and self.default is not None:
            proxy, trusted = self.default.proxy, True
        else:
            trusted = False
        options = EgressOptions(
            client_cert=cert.encode() if cert else None,
            client_key=key.encode() if key else None,
            ca_bundle=ca_bundle.encode() if ca_bundle else None,
            proxy=proxy, proxy_trusted=trusted)
        return DestinationEgress(revision, options, auth)

    # OAuth2 tokens

    async def _token(self, destination_id: int, egress: DestinationEgress,
                     stale: str | None) -> str:
        """A token to send: this worker's while usable (and while it lives, with a refresh
        started behind it), else the next one (`_refresh`). `stale`: a token the
        destination refused, not to be used again."""
        held = self.tokens.get(destination_id)
        if stale is None and held is not None and held.revision == egress.revision:
            now = time.monotonic()
            if now < held.usable_until:
                return held.token
            if now < held.alive_until:
                self._refresh_task(destination_id, egress, None)
                return held.token
        # Shielded: a send cancelled while waiting leaves the refresh to the others.
        token = await asyncio.shield(self._refresh_task(destination_id, egress, stale))
        if token == stale:  # a refresh begun before the refusal brought the same token
            token = await asyncio.shield(self._refresh_task(destination_id, egress, stale))
        return token

    def _refresh_task(self, destination_id: int, egress: DestinationEgress,
                      stale: str | None) -> asyncio.Task[str]:
        """The refresh under way for this destination, else a new one."""
        task = self.refreshing.get(destination_id)
        if task is None or (task.done() and stale is not None):
            task = asyncio.get_running_loop().create_task(
                self._refresh(destination_id, egress, stale))
            self.refreshing[destination_id] = task
            task.add_done_callback(lambda done: self._refreshed(destination_id, done))
        return task

    def _refreshed(self, destination_id: int, task: asyncio.Task[str]) -> None:
        if self.refreshing.get(destination_id) is task:
            del self.refreshing[destination_id]
        if not task.cancelled():
            task.exception()  # a background refresh's failure: the next send tries again

    async def _refresh(self, destination_id: int, egress: DestinationEgress,
                       stale: str | None) -> str:
        """The database's token, else a new one fetched under the destination's token
        lock."""
        pool = await self._database()
        read = OauthTokenReadParams(destination_id=destination_id,
                                    egress_revision=egress.revision)
        async with pool.connection() as conn:
            row = await (await queries.OAUTH_TOKEN_READ.run(conn, read)).fetchone()
            if row is not None and row[0] != stale:
                return self._keep(destination_id, egress.revision, *row)
            async with conn.transaction():
                await queries.OAUTH_TOKEN_LOCK.run(conn, OauthTokenLockParams(
                    advisory_lock_class=OAUTH_LOCK_CLASS, destination_id=destination_id))
                # Another worker may have fetched one while this one waited for the lock.
                row = await (await queries.OAUTH_TOKEN_READ.run(conn, read)).fetchone()
                if row is not None and row[0] != stale:
                    return self._keep(destination_id, egress.revision, *row)
                token, lifetime_s = await self._fetch(egress)
                usable_s = refresh_after_s(lifetime_s)
                await queries.OAUTH_TOKEN_STORE.run(conn, OauthTokenStoreParams(
                    destination_id=destination_id, egress_revision=egress.revision,
                    access_token=token, lifetime_s=lifetime_s, refresh_after_s=usable_s))
        return self._keep(destination_id, egress.revision, token, usable_s, lifetime_s)

    def _keep(self, destination_id: int, revision: int, token: str, usable_s: float,
              alive_s: float) -> str:
        # Sent while its refresh runs until half of what was left at the refresh time is
        # left: a request must reach the receiver before the token dies.
        now = time.monotonic()
        self.tokens[destination_id] = HeldToken(revision, token, now + usable_s,
                                                now + (usable_s + alive_s) / 2)
        return token

    async def _fetch(self, egress: DestinationEgress) -> tuple[str, float]:
        """One token request, through the destination's proxy and TLS settings, its
        token_url checked against the target policy like any destination."""
        assert egress.auth is not None
        if self._token_http is None:
            self._token_http = CurlPool(max_connects=16, max_body=MAX_TOKEN_BYTES,
                                        max_drain=MAX_TOKEN_BYTES, lookup=self.lookup,
                                        ca_bundle=self.ca_bundle)
        auth = egress.auth
        headers, form = token_request(auth["client_id"], auth["client_secret"],
                                      auth.get("scope"))
        result = await self._token_http.post_checked(
            auth["token_url"], headers, form, TOKEN_TIMEOUT_MS, self.allowance,
            egress.options)
        if result.error is not None:
            raise OAuthFailed(result.error)
        try:
            return parse_token(result.status_code, result.body)
        except TokenError as exc:
            raise OAuthFailed(str(exc)) from None

    async def close(self) -> None:
        """Cancel what waits for settings or tokens (their claims come back released)."""
        for refresh in list(self.refreshing.values()):
            refresh.cancel()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self._token_http is not None:
            await self._token_http.close()
        if self._db is not None:
            await self._db.close()

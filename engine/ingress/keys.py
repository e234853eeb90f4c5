"""Who calls: the admin token or a tenant's API key, checked in memory.

Each ingress process holds every live key as its SHA-256 (api_keys stores nothing else)
with its tenant and scopes. A background loop reads `auth_generation` every REFRESH_S and
reloads the keys when it moved; creating or revoking a key, or deleting or disabling a
tenant, moves it in the same statement (engine/sql/tenants/). So a revoked key is refused
by every process within REFRESH_S plus one query, and a request costs no database round
trip in the steady state (docs/decisions/0027).

A key the ring does not know may be one created a moment ago through another process: the
ring then refreshes at once. Misses share refreshes (one at a time per process, each
serving every miss that came before it began), so a flood of wrong keys keeps at most one
small query of each process running.

`last_used_at` is kept in memory per key and written every LAST_USED_FLUSH_S for the keys
used since (keys_mark_used.sql): never a write per request.

Portal tokens (`ept_…`, engine/ingress/portal_tokens.py) are checked against the portal
signing key, loaded with the keys; the tenant a token names is read once per generation
and kept (deleting or disabling a tenant moves the generation).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg_pool

from engine.db import queries
from engine.db.sql_params import KeysMarkUsedParams, TenantParams
from engine.ingress import portal_tokens
from engine.ingress.errors import ApiError
from engine.ingress.http import TenantScope
from engine.ingress.portal_tokens import PortalGrant, PortalTokenRefused

log = logging.getLogger(__name__)

KEY_PREFIX = "ek_"
SCOPES = ("send", "read", "manage")
REFRESH_S = 0.25
LAST_USED_FLUSH_S = 5.0
# How much of a key lists show: "ek_" and six more characters, not enough to guess it.
SHOWN_PREFIX = 9


@dataclass(frozen=True)
class Caller:
    """Who a request comes from. `tenant` is None for the admin token, which reaches
    every tenant (and means `default` on the unscoped paths)."""

    tenant: TenantScope | None
    scopes: frozenset[str]
    key_id: int | None = None
    tenant_disabled: bool = False
    portal: PortalGrant | None = None  # a portal link's token, not an API key

    @property
    def admin(self) -> bool:
        return self.tenant is None


ADMIN = Caller(None, frozenset(SCOPES))
# A portal link may read its tenant's objects and, unless read-only, manage its
# destinations and replay its deliveries; it never sends events of its own.
PORTAL_SCOPES = frozenset({"read", "manage"})
PORTAL_READ_ONLY_SCOPES = frozenset({"read"})


def portal_refused(reason: str) -> ApiError:
    return ApiError(401, "unauthorized", reason,
                    [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")])


def new_key() -> tuple[str, str, bytes]:
    """A new key: (the key, shown once; its shown prefix; its hash, stored)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, key[:SHOWN_PREFIX], key_hash(key.encode())


def key_hash(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class KeyRing:
    def __init__(self, admin_token: bytes | None,
                 connection: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
        self.admin_token = admin_token
        self._connection = connection
        self._keys: dict[bytes, Caller] = {}
        self.portal_key: tuple[int, bytes] | None = None  # (id, secret): the live one
        # Tenant id -> (uid, disabled), None when deleted: the tenants portal tokens named
        # since the generation last moved.
        self._portal_tenants: dict[int, tuple[str, bool] | None] = {}
        self._generation: int | None = None
        self._refresh_began = -1.0
        self._used: dict[int, dt.datetime] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    # The request side ---------------------------------------------------------------------

    async def caller(self, authorization: bytes | None) -> Caller | None:
        """The caller a bearer token names; None when it names nobody (401)."""
        if authorization is None:
            return None
        scheme, _, given = authorization.partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        token = given.strip()
        if self.admin_token is not None and hmac.compare_digest(token, self.admin_token):
            return ADMIN
        if token.startswith(portal_tokens.PORTAL_PREFIX.encode()):
            return await self.portal_caller(token.decode("latin-1"))
        if not token.startswith(KEY_PREFIX.encode()):
            return None
        digest = key_hash(token)
        found = self._keys.get(digest)
        if found is None:
            await self.refresh(since=time.monotonic())
            found = self._keys.get(digest)
        if found is not None and found.key_id is not None:
            self._used[found.key_id] = dt.datetime.now(dt.UTC)
        return found

    async def portal_caller(self, token: str, now: float | None = None) -> Caller:
        """The caller a portal token names, or a 401 saying why it names nobody. A token
        signed with a key newer than this process's (made a moment ago elsewhere)
        refreshes the ring once, as an unknown API key does."""
        named = portal_tokens.key_id_of(token)
        if named is not None and (self.portal_key is None or named > self.portal_key[0]):
            await self.refresh(since=time.monotonic())
        key_id, secret = self.portal_key or (None, None)
        try:
            grant = portal_tokens.verify(token, key_id, secret,
                                         time.time() if now is None else now)
        except PortalTokenRefused as refused:
            raise portal_refused(refused.reason) from None
        tenant = await self._portal_tenant(grant.tenant_id)
        if tenant is None:
            raise portal_refused("the portal link's tenant no longer exists")
        uid, disabled = tenant
        scopes = PORTAL_READ_ONLY_SCOPES if grant.read_only else PORTAL_SCOPES
        return Caller(TenantScope(grant.tenant_id, uid), scopes, None, disabled, grant)

    async def _portal_tenant(self, tenant_id: int) -> tuple[str, bool] | None:
        if tenant_id in self._portal_tenants:
            return self._portal_tenants[tenant_id]
        tenants = self._portal_tenants
        async with self._connection() as conn:
            row = await (await queries.PORTAL_TENANT_READ.run(
                conn, TenantParams(tenant_id=tenant_id))).fetchone()
        found = (row[0], bool(row[1])) if row else None
        tenants[tenant_id] = found  # not kept if the generation moved meanwhile
        return found

    # The background side ------------------------------------------------------------------

    def start(self) -> None:
        self._stopping = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="key ring")

    async def stop(self) -> None:
        """Ends the loop between two refreshes (a cancel could land inside the pool's
        getconn, which may absorb it), then writes the last uses."""
        if self._task is not None:
            self._stopping.set()
            await self._task
        with suppress(psycopg.Error, psycopg_pool.PoolTimeout, OSError, ApiError):
            await self.flush_last_used()

    async def _run(self) -> None:
        flushed = time.monotonic()
        while not self._stopping.is_set():
            try:
                await self.refresh()
                if time.monotonic() - flushed >= LAST_USED_FLUSH_S:
                    flushed = time.monotonic()
                    await self.flush_last_used()
            except Exception:  # the gate logs outages; the ring keeps its last keys
                log.debug("key refresh failed", exc_info=True)
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), REFRESH_S)

    async def refresh(self, since: float | None = None) -> None:
        """Reload the keys if auth_generation moved since the last load. With `since`
        (a miss), a refresh that began after that moment is enough: the misses waiting
        together share one."""
        async with self._lock:
            if since is not None and self._refresh_began >= since:
                return
            self._refresh_began = time.monotonic()
            async with self._connection() as conn:
                row = await (await queries.AUTH_GENERATION_READ.run(conn)).fetchone()
                generation = row[0] if row else 0
                if generation != self._generation:
                    rows = await (await queries.KEYS_LIVE.run(conn)).fetchall()
                    # After the keys: a rotation committed between the two reads then
                    # gives the newer key, never an older one than the generation kept.
                    portal_key = await (await queries.PORTAL_KEY_LIVE.run(conn)).fetchone()
                    self.portal_key = (portal_key[0], bytes(portal_key[1])) if portal_key else None
                    self._portal_tenants = {}
                    self._keys = {
                        bytes(digest): Caller(TenantScope(tenant_id, uid), frozenset(scopes),
                                              key_id, disabled)
                        for key_id, digest, scopes, tenant_id, uid, disabled, _ in rows
                    }
                    # The generation read with the keys: a change committed between the
                    # two reads is then seen as a move at the next refresh.
                    self._generation = rows[0][6] if rows else generation

    async def flush_last_used(self) -> None:
        if not self._used:
            return
        used, self._used = self._used, {}
        async with self._connection() as conn:
            await queries.KEYS_MARK_USED.run(conn, KeysMarkUsedParams(
                key_ids=list(used), used_at=list(used.values())))

"""The tenant and key handlers of the ingress API, a mixin of IngressApp (app.py) like
destinations_api.py: the admin token's alone (app.py refuses a tenant key before these
run). SQL in engine/sql/tenants/."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from engine.db import queries
from engine.db.sql_params import (
    KeyCreateParams,
    KeyRevokeParams,
    TenantCreateParams,
    TenantParams,
    TenantPatchParams,
    TenantPurgePendingParams,
    TenantsListParams,
)
from engine.ingress import errors
from engine.ingress import schemas as s
from engine.ingress.console.api import cursor_param
from engine.ingress.http import Request, Response, int_param, json_response
from engine.ingress.keys import SCOPES, KeyRing, new_key

# A deleted tenant's pending deliveries go in batches of this many, each its own
# transaction (tenant_purge_pending.sql).
PURGE_BATCH = 1000

_json = msgspec.json.Encoder()


def _tenant(row: tuple) -> s.Tenant:
    return s.Tenant(*row)


def _key(row: tuple, tenant_uid: str) -> s.ApiKey:
    return s.ApiKey(*row, tenant=tenant_uid)


def holds_nul(value: object) -> bool:
    """Whether a decoded JSON document has the NUL character in a key or a string (walked
    without recursion: a 4 KiB document can nest 2,000 deep)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _metadata(value: dict[str, Any] | None) -> str | None:
    if value is None:
        return None
    text = _json.encode(value).decode()
    if len(text) > s.MAX_METADATA_BYTES:
        raise errors.invalid(f"metadata: over {s.MAX_METADATA_BYTES} bytes as JSON")
    if holds_nul(value):  # jsonb refuses \u0000 anywhere in a document
        raise errors.invalid("metadata: the NUL character (\\u0000) cannot be stored")
    return text


class TenantApi:
    """Needs `_connection()` and `keys` from the app it is mixed into. A change to who
    may call reloads this process's keys before it is answered (the others follow within
    keys.REFRESH_S)."""

    keys: KeyRing

    def _connection(self) -> Any:
        raise NotImplementedError

    async def create_tenant(self, request: Request) -> Response:
        body: s.TenantCreate = await request.decode(s.TenantCreate)
        params = TenantCreateParams(uid=body.uid, name=body.name,
                                    metadata=_metadata(body.metadata))
        async with self._connection() as conn:
            row = await (await queries.TENANT_CREATE.run(conn, params)).fetchone()
        if row is None:
            raise errors.conflict(f"uid: a tenant {body.uid!r} exists already")
        return json_response(201, _tenant(row))

    async def list_tenants(self, request: Request) -> Response:
        params = request.query({"limit", "after"})
        limit = int_param(params, "limit", 1, s.MAX_LIST_LIMIT) or s.DEFAULT_LIST_LIMIT
        async with self._connection() as conn:
            rows = await (await queries.TENANTS_LIST.run(conn, TenantsListParams(
                after_id=cursor_param(params), limit=limit))).fetchall()
        tenants = [_tenant(row) for row in rows]
        next_cursor = str(tenants[-1].id) if len(tenants) == limit else None
        return json_response(200, s.TenantPage(tenants, next_cursor))

    async def read_tenant(self, request: Request) -> Response:
        async with self._connection() as conn:
            row = await (await queries.TENANT_READ.run(
                conn, TenantParams(tenant_id=request.tenant.id))).fetchone()
        if row is None:
            raise errors.not_found("tenant")
        return json_response(200, _tenant(row))

    async def patch_tenant(self, request: Request) -> Response:
        body: s.TenantPatch = await request.decode(s.TenantPatch)
        params = TenantPatchParams(
            tenant_id=request.tenant.id,
            set_name=body.name is not UNSET, name=None if body.name is UNSET else body.name,
            set_metadata=body.metadata is not UNSET,
            metadata=None if body.metadata is UNSET else _metadata(body.metadata),
            disabled=None if body.disabled is UNSET else body.disabled,
            set_max_in_flight=body.max_in_flight is not UNSET,
            max_in_flight=None if body.max_in_flight is UNSET else body.max_in_flight,
            set_rate_limit=body.rate_limit is not UNSET,
            rate_limit=None if body.rate_limit is UNSET else body.rate_limit,
        )
        async with self._connection() as conn:
            row = await (await queries.TENANT_PATCH.run(conn, params)).fetchone()
        if row is None:
            raise errors.not_found("tenant")
        if body.disabled is not UNSET:
            await self.keys.refresh()
        return json_response(200, _tenant(row))

    async def delete_tenant(self, request: Request) -> Response:
        if request.tenant.uid == "default":
            raise errors.conflict("the default tenant cannot be deleted")
        tenant = TenantParams(tenant_id=request.tenant.id)
        async with self._connection() as conn:
            if await (await queries.TENANT_DELETE.run(conn, tenant)).fetchone() is None:
                raise errors.not_found("tenant")
            batch = TenantPurgePendingParams(tenant_id=request.tenant.id,
                                             batch_limit=PURGE_BATCH)
            while True:
                row = await (await queries.TENANT_PURGE_PENDING.run(conn, batch)).fetchone()
                if row is None or row[0] < PURGE_BATCH:
                    break
        await self.keys.refresh()
        return Response(204)

    async def create_key(self, request: Request) -> Response:
        body: s.KeyCreate = await request.decode(s.KeyCreate)
        scopes = sorted(set(body.scopes or SCOPES), key=SCOPES.index)
        key, prefix, digest = new_key()
        params = KeyCreateParams(tenant_id=request.tenant.id, name=body.name, prefix=prefix,
                                 key_hash=digest, scopes=scopes)
        async with self._connection() as conn:
            row = await (await queries.KEY_CREATE.run(conn, params)).fetchone()
        if row is None:
            raise errors.not_found("tenant")
        await self.keys.refresh()
        created = _key(row, request.tenant.uid)
        created.key = key
        return json_response(201, created)

    async def list_keys(self, request: Request) -> Response:
        request.query(set())
        async with self._connection() as conn:
            rows = await (await queries.KEYS_LIST.run(
                conn, TenantParams(tenant_id=request.tenant.id))).fetchall()
        return json_response(200, s.ApiKeyList([_key(row, request.tenant.uid) for row in rows]))

    async def revoke_key(self, request: Request) -> Response:
        assert request.path_id is not None
        async with self._connection() as conn:
            row = await (await queries.KEY_REVOKE.run(conn, KeyRevokeParams(
                tenant_id=request.tenant.id, key_id=request.path_id))).fetchone()
        if row is None:
            raise errors.not_found("key")
        await self.keys.refresh()
        return Response(204)

"""The event-type catalog's handlers (SPEC, "Customer portal and event-type catalog"), a
mixin of IngressApp (app.py) like destinations_api.py. The catalog is the engine's, not a
tenant's: writes are the admin token's alone (app.py refuses a tenant key before these
run), reads need the `read` scope. SQL in engine/sql/catalog/; the ingest check in
catalog.py.

Every write checks the whole type as it will be stored (the name, the schema against its
draft, its size, the example against the schema) before any statement runs, so a refused
request writes nothing; a write moves event_type_generation and this process reloads its
catalog before answering (the others follow within catalog.REFRESH_S).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from engine.db import queries
from engine.db.sql_params import EventTypeParams, EventTypesListParams, EventTypeWriteParams
from engine.ingress import errors
from engine.ingress import schemas as s
from engine.ingress.catalog import (
    EventTypeCatalog,
    SchemaProblem,
    check_name,
    compile_schema,
    first_failure,
)
from engine.ingress.http import Request, Response, int_param, json_response
from engine.ingress.tenants_api import holds_nul

_json = msgspec.json.Encoder()


def _event_type(row: tuple) -> s.CatalogEventType:
    name, description, schema, example, deprecated, created_at, updated_at = row
    return s.CatalogEventType(name, description, schema, example, deprecated, created_at,
                       updated_at)


def _checked(name: str, description: str | None, schema: dict[str, Any] | None,
             example: Any, deprecated: bool) -> EventTypeWriteParams:
    """The row to write, or a 422 naming the first thing wrong with it."""
    try:
        check_name(name)
        for field, value in (("schema", schema), ("example", example)):
            if holds_nul(value):  # jsonb refuses \u0000 anywhere in a document
                raise SchemaProblem(f"{field}: the NUL character (\\u0000) cannot be stored")
        if schema is not None:
            validator = compile_schema(schema)
            if example is not None:
                failure = first_failure(validator, example, "example")
                if failure is not None:
                    raise SchemaProblem(f"{failure} (the example fails its own schema)")
    except SchemaProblem as exc:
        raise errors.invalid(str(exc)) from None
    return EventTypeWriteParams(
        name=name, description=description,
        schema=None if schema is None else _json.encode(schema).decode(),
        example=None if example is None else _json.encode(example).decode(),
        deprecated=deprecated)


class EventTypeApi:
    """Needs `_connection()` and `catalog` from the app it is mixed into."""

    catalog: EventTypeCatalog

    def _connection(self) -> Any:
        raise NotImplementedError

    async def create_event_type(self, request: Request) -> Response:
        body: s.EventTypeCreate = await request.decode(s.EventTypeCreate)
        params = _checked(body.name, body.description, body.schema, body.example,
                          body.deprecated)
        async with self._connection() as conn:
            row = await (await queries.EVENT_TYPE_CREATE.run(conn, params)).fetchone()
        if row is None:
            raise errors.conflict(f"name: an event type {body.name!r} exists already")
        await self.catalog.refresh()
        return json_response(201, _event_type(row))

    async def list_event_types(self, request: Request) -> Response:
        params = request.query({"limit", "after"})
        limit = int_param(params, "limit", 1, s.MAX_LIST_LIMIT) or s.DEFAULT_LIST_LIMIT
        after = params.get("after")
        if after is not None:
            try:
                check_name(after)
            except SchemaProblem:
                raise errors.invalid("after: must be the `next` cursor of a page") from None
        async with self._connection() as conn:
            rows = await (await queries.EVENT_TYPES_LIST.run(conn, EventTypesListParams(
                after_name=after, limit=limit))).fetchall()
        types = [_event_type(row) for row in rows]
        next_cursor = types[-1].name if len(types) == limit else None
        return json_response(200, s.EventTypePage(types, next_cursor))

    async def read_event_type(self, request: Request) -> Response:
        assert request.path_name is not None
        async with self._connection() as conn:
            row = await (await queries.EVENT_TYPE_READ.run(
                conn, EventTypeParams(name=request.path_name))).fetchone()
        if row is None:
            raise errors.not_found("event type")
        return json_response(200, _event_type(row))

    async def patch_event_type(self, request: Request) -> Response:
        """The stored type merged with the change, checked whole (a new schema must pass
        the stored example, a new example the stored schema), in one transaction with
        the row locked."""
        assert request.path_name is not None
        body: s.EventTypePatch = await request.decode(s.EventTypePatch)
        async with self._connection() as conn, conn.transaction():
            row = await (await queries.EVENT_TYPE_LOCK.run(
                conn, EventTypeParams(name=request.path_name))).fetchone()
            if row is None:
                raise errors.not_found("event type")
            stored = _event_type(row)
            params = _checked(
                stored.name,
                stored.description if body.description is UNSET else body.description,
                stored.schema if body.schema is UNSET else body.schema,
                stored.example if body.example is UNSET else body.example,
                stored.deprecated if body.deprecated is UNSET else body.deprecated)
            row = await (await queries.EVENT_TYPE_UPDATE.run(conn, params)).fetchone()
        assert row is not None
        await self.catalog.refresh()
        return json_response(200, _event_type(row))

    async def delete_event_type(self, request: Request) -> Response:
        assert request.path_name is not None
        async with self._connection() as conn:
            row = await (await queries.EVENT_TYPE_DELETE.run(
                conn, EventTypeParams(name=request.path_name))).fetchone()
        if row is None:
            raise errors.not_found("event type")
        await self.catalog.refresh()
        return Response(204)

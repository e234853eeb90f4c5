"""The API's operations, declared once. The router (app.py) binds a handler to each and
/openapi.json is generated from them and from the msgspec types that validate requests, so
the document cannot drift from the server."""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from engine import __version__
from engine.ingress import schemas as s

JSON = "application/json"


@dataclass(frozen=True)
class Param:
    name: str
    schema: dict[str, Any]
    description: str = ""


@dataclass(frozen=True)
class Operation:
    id: str
    method: str
    path: str
    summary: str
    status: int
    response: type | None
    request: type | None = None
    query: tuple[Param, ...] = ()
    errors: tuple[int, ...] = ()
    headers: tuple[Param, ...] = ()
    auth: bool = True
    content_type: str = JSON
    tags: tuple[str, ...] = field(default=())
    # What a tenant key needs for it: one of its scopes ("send", "read", "manage"), or
    # "admin": the admin token's alone (SPEC, "Tenants and API keys").
    access: str = "read"
    # Also served under /v1/tenants/{tenant}/ (its path after /v1), for that tenant.
    tenant_scoped: bool = False

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        """The path as a regex: `{id}` matches a decimal integer, `{name}` an event type's
        name; `{tenant}` is matched by the router before (app.py), and stands for itself
        here."""
        escaped = (re.escape(self.path)
                   .replace(re.escape("{id}"), "(?P<id>[0-9]{1,19})")
                   .replace(re.escape("{name}"), f"(?P<name>{s.EVENT_TYPE_NAME})"))
        return re.compile("^" + escaped + "$")

    def for_tenant(self) -> Operation:
        """The same operation under /v1/tenants/{tenant}/, as /openapi.json lists it."""
        return dataclasses.replace(self, id="tenant_" + self.id,
                                   path=TENANT_PATH + self.path.removeprefix("/v1"),
                                   tenant_scoped=False)


TENANT_PATH = "/v1/tenants/{tenant}"
PORTAL_PAGE_PATH = "/portal/{tenant}"
NAME_SCHEMA = {"type": "string", "pattern": s.EVENT_TYPE_NAME_PATTERN,
               "description": "the event type's name"}
_NAME_CURSOR = {"type": "string", "pattern": s.EVENT_TYPE_NAME_PATTERN}
ID_SCHEMA = {"type": "integer", "minimum": 1, "maximum": s.MAX_ID}
TENANT_SCHEMA = {"type": "string", "pattern": s.TENANT_UID_PATTERN,
                 "description": "the tenant's id or uid"}
_TEXT = {"type": "string", "minLength": 1, "maxLength": 256}
_TIME = {"type": "string", "format": "date-time"}
_WINDOW = {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?(ms|s|m|h|d)$"}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": s.MAX_LIST_LIMIT,
          "default": s.DEFAULT_LIST_LIMIT}
_CURSOR = {"type": "string", "pattern": "^[0-9]{1,19}$"}
_BODY_ERRORS = (400, 413, 422)
# W3C Trace Context: the parent of the event's attempt spans; a malformed one is ignored.
_TRACEPARENT = Param("traceparent", {"type": "string"},
                     "W3C trace context: the parent of the event's delivery attempt spans")
_DB = (503,)
_ADMIN = (403,)

OPERATIONS: tuple[Operation, ...] = (
    Operation("create_destination", "POST", "/v1/destinations", "Create a destination",
              201, s.Destination, s.DestinationCreate, errors=(*_BODY_ERRORS, *_DB),
              access="manage", tenant_scoped=True),
    Operation("list_destinations", "GET", "/v1/destinations", "List destinations (no secrets)",
              200, s.DestinationList, errors=_DB,
              tenant_scoped=True),
    Operation("read_destination", "GET", "/v1/destinations/{id}", "Read a destination",
              200, s.Destination, errors=(404, *_DB),
              tenant_scoped=True),
    Operation("patch_destination", "PATCH", "/v1/destinations/{id}",
              "Change, pause, resume, disable a destination or rotate its secret",
              200, s.Destination, s.DestinationPatch, errors=(404, *_BODY_ERRORS, *_DB),
              access="manage", tenant_scoped=True),
    Operation("delete_destination", "DELETE", "/v1/destinations/{id}",
              "Delete a destination (its deliveries are kept, no longer sent)",
              204, None, errors=(404, *_DB),
              access="manage", tenant_scoped=True),
    Operation("replay_destination", "POST", "/v1/destinations/{id}/replay",
              "Replay the destination's dead deliveries (since a time)",
              202, s.ReplayAccepted, s.ReplayDead, errors=(404, *_BODY_ERRORS, *_DB),
              access="manage", tenant_scoped=True),
    Operation("send_test_event", "POST", "/v1/destinations/{id}/test",
              "Send the destination a test event of a type: the payload given, else the"
              " event-type catalog's example, else {}; a real event to it alone", 202,
              s.EventAccepted, s.TestEventCreate, errors=(404, *_BODY_ERRORS, *_DB),
              access="manage", tenant_scoped=True),
    Operation("create_event", "POST", "/v1/events",
              "Accept an event: answered after it and its deliveries are committed",
              202, s.EventAccepted, s.EventCreate,
              headers=(Param("Idempotency-Key", {"type": "string", "minLength": 1,
                                                 "maxLength": 256}), _TRACEPARENT),
              errors=(*_BODY_ERRORS, 409, *_DB),
              access="send", tenant_scoped=True),
    Operation("create_event_batch", "POST", "/v1/events/batch",
              "Accept up to 1000 events, all or nothing in one transaction (body up to"
              " 32 times the request limit; each payload within the limit)",
              202, s.BatchAccepted, s.EventBatch, errors=(*_BODY_ERRORS, 409, *_DB),
              headers=(_TRACEPARENT,),
              access="send", tenant_scoped=True),
    Operation("read_event", "GET", "/v1/events/{id}", "Read an event with its deliveries",
              200, s.Event, errors=(404, *_DB),
              tenant_scoped=True),
    Operation("delete_event_payload", "DELETE", "/v1/events/{id}/payload",
              "Remove an event's payload at once, keeping the event and its deliveries'"
              " history (it then reads null, and its deliveries cannot be replayed);"
              " 409 while a delivery of it is pending or in flight",
              204, None, errors=(404, 409, *_DB),
              access="manage", tenant_scoped=True),
    Operation("list_deliveries", "GET", "/v1/deliveries", "List deliveries, newest first",
              200, s.DeliveryPage,
              query=(
                  Param("destination_id", ID_SCHEMA),
                  Param("status", {"type": "string",
                                   "enum": ["pending", "in_flight", "delivered", "dead"]}),
                  Param("limit", {"type": "integer", "minimum": 1,
                                  "maximum": s.MAX_LIST_LIMIT,
                                  "default": s.DEFAULT_LIST_LIMIT}),
                  Param("after", {"type": "string", "pattern": "^[0-9]{1,19}$"},
                        "the `next` cursor of the previous page"),
                  Param("event_type", _TEXT,
                        "only deliveries of events of this type (then newest event first)"),
                  Param("since", _TIME, "only deliveries of events created at or after"),
                  Param("until", _TIME, "only deliveries of events created at or before"),
              ),
              errors=(422, *_DB),
              tenant_scoped=True),
    Operation("read_delivery", "GET", "/v1/deliveries/{id}", "Read a delivery with attempts",
              200, s.DeliveryDetail, errors=(404, *_DB),
              tenant_scoped=True),
    Operation("replay_delivery", "POST", "/v1/deliveries/{id}/replay",
              "Send a delivery again as a first attempt", 202, s.Delivery,
              errors=(404, 409, *_DB),
              access="manage", tenant_scoped=True),
    # The console's reads (console/api.py).
    Operation("list_events", "GET", "/v1/events",
              "List events without payloads, newest first (created_at, then id)",
              200, s.EventPage,
              query=(
                  Param("type", _TEXT),
                  Param("since", _TIME, "created at or after"),
                  Param("until", _TIME, "created at or before"),
                  Param("limit", _LIMIT),
                  Param("after", _CURSOR, "the `next` cursor of the previous page"),
              ),
              errors=(422, *_DB),
              tenant_scoped=True),
    Operation("destination_stats", "GET", "/v1/destinations/{id}/stats",
              "A destination's attempts in a window (to the minute) by outcome, duration"
              " p50/p90/p99 (from a histogram, within 19 %), backlog and dead count",
              200, s.DestinationStats,
              query=(
                  Param("window", _WINDOW, "a duration from 1s to 24h; default 1h"),
                  Param("dead_since", _TIME, "count the dead deliveries since this time"),
              ),
              errors=(404, 422, *_DB),
              tenant_scoped=True),
    Operation("overview", "GET", "/v1/overview",
              "Queue depth, attempts per minute over the last hour, breakers, each"
              " destination's window and engine status's warnings",
              200, s.Overview,
              query=(Param("window", _WINDOW,
                           "the destinations' window, 1s to 24h; default 1h"),),
              errors=(422, *_DB),
              access="admin"),
    Operation("console_page", "GET", "/console", "The operator console (HTML)", 200, None,
              auth=False, content_type="text/html"),
    Operation("console_script", "GET", "/console/console.js", "The console's script", 200,
              None, auth=False, content_type="text/javascript"),
    Operation("console_pages_script", "GET", "/console/console_pages.js",
              "The console's pages", 200, None, auth=False, content_type="text/javascript"),
    Operation("console_style", "GET", "/console/console.css", "The console's styles", 200,
              None, auth=False, content_type="text/css"),
    Operation("healthz", "GET", "/healthz", "Liveness and database check", 200, s.Health,
              errors=(503,), auth=False),
    Operation("metrics", "GET", "/metrics", "Prometheus metrics", 200, None,
              content_type="text/plain",
              access="admin"),
    Operation("openapi", "GET", "/openapi.json", "This document", 200, None),
    # Tenants and their keys (tenants_api.py): the admin token's alone.
    Operation("create_tenant", "POST", "/v1/tenants", "Create a tenant", 201, s.Tenant,
              s.TenantCreate, errors=(*_BODY_ERRORS, 409, *_ADMIN, *_DB), access="admin"),
    Operation("list_tenants", "GET", "/v1/tenants", "List tenants with their backlogs, by id",
              200, s.TenantPage,
              query=(Param("limit", _LIMIT),
                     Param("after", _CURSOR, "the `next` cursor of the previous page")),
              errors=(422, *_ADMIN, *_DB), access="admin"),
    Operation("read_tenant", "GET", TENANT_PATH, "Read a tenant", 200, s.Tenant,
              errors=(404, *_ADMIN, *_DB), access="admin"),
    Operation("patch_tenant", "PATCH", TENANT_PATH,
              "Change a tenant's name, metadata, limits, or disable it", 200, s.Tenant,
              s.TenantPatch, errors=(404, *_BODY_ERRORS, *_ADMIN, *_DB), access="admin"),
    Operation("delete_tenant", "DELETE", TENANT_PATH,
              "Delete a tenant: its keys, destinations and pending deliveries", 204, None,
              errors=(404, 409, *_ADMIN, *_DB), access="admin"),
    Operation("create_key", "POST", TENANT_PATH + "/keys",
              "Create an API key for the tenant (the key is in this answer only)", 201,
              s.ApiKey, s.KeyCreate, errors=(404, *_BODY_ERRORS, *_ADMIN, *_DB),
              access="admin"),
    Operation("list_keys", "GET", TENANT_PATH + "/keys", "List the tenant's keys", 200,
              s.ApiKeyList, errors=(404, *_ADMIN, *_DB), access="admin"),
    Operation("revoke_key", "DELETE", TENANT_PATH + "/keys/{id}",
              "Revoke a key: refused by every ingress process within a second", 204, None,
              errors=(404, *_ADMIN, *_DB), access="admin"),
    # The customer portal (portal.py).
    Operation("create_portal_link", "POST", TENANT_PATH + "/portal",
              "A signed, short-lived link to the tenant's portal (1 h by default, at most"
              " 7 days; read_only: it can change nothing)", 201, s.PortalLink,
              s.PortalLinkCreate, errors=(404, *_BODY_ERRORS, *_ADMIN, *_DB),
              access="admin"),
    Operation("rotate_portal_key", "POST", "/v1/portal-key/rotate",
              "A new portal signing key: every link made before stops working on every"
              " ingress process within a second", 200, s.PortalKeyRotated,
              errors=(*_ADMIN, *_DB), access="admin"),
    Operation("portal_page", "GET", PORTAL_PAGE_PATH,
              "The tenant's portal (HTML): the console restricted to the tenant of the"
              " link's token; 401 with a page saying why for an expired, changed or other"
              " tenant's link", 200, None,
              query=(Param("token", {"type": "string"}, "the portal link's token"),),
              errors=(401, 404, 422), auth=False, content_type="text/html"),
    Operation("read_session", "GET", "/v1/session",
              "Who the calling token is: the admin, a tenant's key or a portal link, its"
              " tenant, scopes and expiry", 200, s.Session, errors=_DB),
    # The event-type catalog (event_types_api.py): one per engine; tenant keys with the
    # read scope may read it, writes are the admin token's alone.
    Operation("create_event_type", "POST", "/v1/event-types",
              "Add an event type, with a JSON Schema its events' payloads must pass", 201,
              s.CatalogEventType, s.EventTypeCreate,
              errors=(*_BODY_ERRORS, 409, *_ADMIN, *_DB),
              access="admin"),
    Operation("list_event_types", "GET", "/v1/event-types", "List event types, by name",
              200, s.EventTypePage,
              query=(Param("limit", _LIMIT),
                     Param("after", _NAME_CURSOR, "the `next` cursor of the previous page")),
              errors=(422, *_DB)),
    Operation("read_event_type", "GET", "/v1/event-types/{name}", "Read an event type", 200,
              s.CatalogEventType, errors=(404, *_DB)),
    Operation("patch_event_type", "PATCH", "/v1/event-types/{name}",
              "Change an event type's description, schema, example or deprecation", 200,
              s.CatalogEventType, s.EventTypePatch,
              errors=(404, *_BODY_ERRORS, *_ADMIN, *_DB),
              access="admin"),
    Operation("delete_event_type", "DELETE", "/v1/event-types/{name}",
              "Remove an event type from the catalog (its events are kept)", 204, None,
              errors=(404, *_ADMIN, *_DB), access="admin"),
)
# Every operation as /openapi.json lists it: the tenant-scoped ones twice.
DOCUMENTED: tuple[Operation, ...] = (
    *OPERATIONS, *(op.for_tenant() for op in OPERATIONS if op.tenant_scoped))

_REASONS = {
    400: "Malformed JSON or non-UTF-8 body",
    401: "Missing or wrong bearer token, or a revoked key",
    403: "The key's scopes do not allow it, or the admin token's alone",
    404: "Unknown id or path",
    409: "Conflict",
    413: "Request body over the limit",
    422: "Validation failed",
    503: "The database cannot commit",
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


# Where an answer's id leads (lets stateful testing follow created resources).
_LINKS = {
    "create_destination": ("read_destination", "patch_destination", "delete_destination",
                           "replay_destination"),
    "create_event": ("read_event",),
}


def build_document(max_timeout_ms: int) -> dict[str, Any]:
    types = {op.request for op in DOCUMENTED if op.request} | {
        op.response for op in DOCUMENTED if op.response
    }
    types.add(s.ErrorBody)
    ordered_types = sorted(types, key=lambda t: t.__name__)
    _, components = msgspec.json.schema_components(
        ordered_types, ref_template="#/components/schemas/{name}"
    )
    # This server's bound, so the document tells the truth about what it accepts.
    for name in ("DestinationCreate", "DestinationPatch"):
        timeout = components[name]["properties"]["timeout_ms"]
        for option in timeout.get("anyOf", [timeout]):
            if option.get("type") == "integer":
                option["maximum"] = max_timeout_ms
    paths: dict[str, dict[str, Any]] = {}
    for op in DOCUMENTED:
        item: dict[str, Any] = {"operationId": op.id, "summary": op.summary}
        parameters: list[dict[str, Any]] = []
        if "{tenant}" in op.path:
            parameters.append({"name": "tenant", "in": "path", "required": True,
                               "schema": TENANT_SCHEMA})
        if "{id}" in op.path:
            parameters.append({"name": "id", "in": "path", "required": True,
                               "schema": ID_SCHEMA})
        if "{name}" in op.path:
            parameters.append({"name": "name", "in": "path", "required": True,
                               "schema": NAME_SCHEMA})
        for p in op.query:
            parameters.append({"name": p.name, "in": "query", "required": False,
                               "schema": p.schema, "description": p.description})
        for p in op.headers:
            parameters.append({"name": p.name, "in": "header", "required": False,
                               "schema": p.schema})
        if parameters:
            item["parameters"] = parameters
        if op.request is not None:
            item["requestBody"] = {
                "required": True,
                "content": {JSON: {"schema": _ref(op.request.__name__)}},
            }
        success: dict[str, Any] = {"description": "OK"}
        if op.response is not None:
            success["content"] = {op.content_type: {"schema": _ref(op.response.__name__)}}
        elif op.content_type != JSON or op.id == "openapi":
            success["content"] = {op.content_type: {"schema": {}}}
        if op.id in _LINKS:
            success["links"] = {
                target: {"operationId": target, "parameters": {"id": "$response.body#/id"}}
                for target in _LINKS[op.id]
            }
        responses: dict[str, Any] = {str(op.status): success}
        codes = set(op.errors) | ({401} if op.auth else set())
        if op.auth and op.access != "admin":
            codes |= {403}  # a key without the scope
        if "{tenant}" in op.path:
            codes |= {404}
        for code in sorted(codes):
            # A page's own refusal is a page (the portal's 401 says why in HTML); its
            # other errors are the API's JSON.
            content = ({op.content_type: {"schema": {}}} if code == 401 and not op.auth
                       else {JSON: {"schema": _ref("ErrorBody")}})
            responses[str(code)] = {"description": _REASONS[code], "content": content}
        item["responses"] = responses
        if not op.auth:
            item["security"] = []
        paths.setdefault(op.path, {})[op.method.lower()] = item
    return {
        "openapi": "3.1.0",
        "info": {"title": "engine", "version": __version__,
                 "description": "Webhook delivery engine: ingress API"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }

"""The event-type catalog over real HTTP (SPEC, "Customer portal and event-type catalog";
issue 40 items 3 and 5): the routes, who may write and read, every refusal a 422/409/403
that writes nothing, payloads checked against their type's schema on single and batch
ingest (the message naming the event's index, the JSON path and the rule),
--strict-event-types, and a change seen by every ingress process within a second."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.testing.ingress_server import Answer, IngressProcess
from tests.kit.api import assert_error, count

TOKEN = "admin-token-for-event-type-tests"
ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "customer": {
            "type": "object",
            "properties": {"tier": {"enum": ["free", "pro"]}, "email": {"type": "string"}},
            "required": ["tier"],
        },
        "items": {"type": "array", "items": {"type": "string", "maxLength": 8}},
    },
    "required": ["id", "customer"],
}
GOOD_ORDER = {"id": 7, "customer": {"tier": "pro"}, "items": ["a"]}


@pytest.fixture(scope="module")
def ingress_token() -> str:
    return TOKEN


def as_key(api: IngressProcess, key: str, method: str, path: str, body: object = None
           ) -> Answer:
    return api.request(method, path, body, auth=False,
                       headers={"Authorization": f"Bearer {key}"})


def make_key(api: IngressProcess, uid: str, scopes: list[str]) -> str:
    assert api.request("POST", "/v1/tenants", {"uid": uid}).status == 201
    answer = api.request("POST", f"/v1/tenants/{uid}/keys", {"name": "k", "scopes": scopes})
    assert answer.status == 201, answer
    return answer.json()["key"]


def make_type(api: IngressProcess, name: str, **fields: object) -> dict:
    answer = api.request("POST", "/v1/event-types", {"name": name, **fields})
    assert answer.status == 201, answer
    return answer.json()


def catalog_state(db: psycopg.Connection) -> tuple:
    """The whole catalog and its generation: equal before and after a refused request."""
    rows = db.execute("SELECT t::text FROM event_types t ORDER BY name").fetchall()
    generation = db.execute("SELECT generation FROM event_type_generation").fetchone()
    return tuple(rows), generation


def test_lifecycle_and_list_pages(api: IngressProcess) -> None:
    made = make_type(api, "order.created", description="An order", schema=ORDER_SCHEMA,
                     example=GOOD_ORDER)
    assert made["name"] == "order.created" and made["schema"] == ORDER_SCHEMA
    assert made["example"] == GOOD_ORDER and made["deprecated"] is False
    assert made["created_at"] and made["updated_at"]
    assert api.request("GET", "/v1/event-types/order.created").json() == made
    patched = api.request("PATCH", "/v1/event-types/order.created",
                          {"deprecated": True, "description": None}).json()
    assert (patched["deprecated"], patched["description"]) == (True, None)
    assert patched["schema"] == ORDER_SCHEMA and patched["updated_at"] >= made["updated_at"]
    for name in ("b-type", "a_type", "Z.type"):
        make_type(api, name)
    first = api.request("GET", "/v1/event-types?limit=3").json()
    second = api.request("GET", f"/v1/event-types?limit=3&after={first['next']}").json()
    names = [t["name"] for t in first["data"] + second["data"]]
    assert names == ["Z.type", "a_type", "b-type", "order.created"]  # byte order
    assert second["next"] is None
    assert api.request("DELETE", "/v1/event-types/order.created").status == 204
    assert_error(api.request("GET", "/v1/event-types/order.created"), 404, "event type")
    assert_error(api.request("DELETE", "/v1/event-types/order.created"), 404)


@pytest.mark.parametrize(("body", "mentions"), [
    ({"name": ""}, "name"),
    ({"name": "a" * 129}, "name"),
    ({"name": "has space"}, "name"),
    ({"name": "é"}, "name"),
    ({"name": "trailing\n"}, "name"),
    ({"name": "x", "schema": {"type": "nope"}}, "schema.type"),
    ({"name": "x", "schema": {"properties": {"a": {"minimum": "one"}}}},
     "schema.properties.a.minimum"),
    ({"name": "x", "schema": {"type": "string", "pattern": "(unclosed"}}, "pattern"),
    ({"name": "x", "schema": {"$schema": "https://example.com/my-draft"}}, "$schema"),
    ({"name": "x", "schema": {"$ref": "http://127.0.0.1:9/remote.json"}}, "remote"),
    ({"name": "x", "schema": {"enum": ["v" * 1000] * 70}}, "over 65536"),
    ({"name": "x", "schema": ORDER_SCHEMA, "example": {"id": 1, "customer": {"tier": "gold"}}},
     "example.customer.tier: enum"),
    ({"name": "x", "schema": ORDER_SCHEMA, "example": {"id": 1}},
     "example: required"),
    ({"name": "x", "schema": ORDER_SCHEMA, "example": {"id": "1", "customer": {"tier": "pro"}}},
     "example.id: type"),
    ({"name": "x", "schema": {"const": "a\x00b"}}, "NUL"),
    ({"name": "x", "unknown": 1}, "unknown"),
])
def test_bad_types_are_422_and_write_nothing(api: IngressProcess, db: psycopg.Connection,
                                             body: dict, mentions: str) -> None:
    before = catalog_state(db)
    assert_error(api.request("POST", "/v1/event-types", body), 422, mentions)
    assert catalog_state(db) == before
    assert count(db, "event_types") == 0


def test_a_patch_is_checked_whole_and_writes_nothing_when_refused(
    api: IngressProcess, db: psycopg.Connection,
) -> None:
    make_type(api, "order", schema=ORDER_SCHEMA, example=GOOD_ORDER)
    before = catalog_state(db)
    # A schema the stored example fails, an example the stored schema refuses.
    assert_error(api.request("PATCH", "/v1/event-types/order",
                             {"schema": {"type": "object", "required": ["missing"]}}),
                 422, "example: required")
    assert_error(api.request("PATCH", "/v1/event-types/order",
                             {"example": {"id": 0, "customer": {"tier": "pro"}}}),
                 422, "example.id: minimum")
    assert_error(api.request("PATCH", "/v1/event-types/order", {"schema": {"type": 3}}),
                 422, "schema.type")
    assert_error(api.request("PATCH", "/v1/event-types/none", {"deprecated": True}), 404)
    assert catalog_state(db) == before


def test_a_duplicate_name_is_409(api: IngressProcess, db: psycopg.Connection) -> None:
    make_type(api, "order", description="first")
    before = catalog_state(db)
    assert_error(api.request("POST", "/v1/event-types", {"name": "order"}), 409, "exists")
    assert catalog_state(db) == before


def test_a_tenant_key_reads_but_never_writes(api: IngressProcess,
                                             db: psycopg.Connection) -> None:
    make_type(api, "order", schema=ORDER_SCHEMA)
    reader = make_key(api, "a", ["read"])
    sender = make_key(api, "b", ["send"])
    assert as_key(api, reader, "GET", "/v1/event-types").json()["data"][0]["name"] == "order"
    assert as_key(api, reader, "GET", "/v1/event-types/order").status == 200
    assert_error(as_key(api, sender, "GET", "/v1/event-types"), 403, "read")
    before = catalog_state(db)
    for key in (reader, sender):
        assert_error(as_key(api, key, "POST", "/v1/event-types", {"name": "new"}), 403,
                     "admin")
        assert_error(as_key(api, key, "PATCH", "/v1/event-types/order",
                            {"deprecated": True}), 403, "admin")
        assert_error(as_key(api, key, "DELETE", "/v1/event-types/order"), 403, "admin")
    assert catalog_state(db) == before
    # The catalog is one per engine: no tenant-scoped form.
    assert_error(api.request("GET", "/v1/tenants/a/event-types"), 404, "path")


@pytest.mark.parametrize(("payload", "mentions"), [
    ({"id": 1, "customer": {"tier": "gold"}}, "payload.customer.tier: enum"),
    ({"id": 1, "customer": {}}, "payload.customer: required"),
    ({"id": 1.5, "customer": {"tier": "pro"}}, "payload.id: type"),
    ({"id": 1, "customer": {"tier": "pro"}, "items": ["ok", "far too long"]},
     "payload.items[1]: maxLength"),
    ([1, 2], "payload: type"),
])
def test_a_payload_that_fails_its_schema_is_422_naming_path_and_rule(
    api: IngressProcess, db: psycopg.Connection, payload: object, mentions: str,
) -> None:
    make_type(api, "order", schema=ORDER_SCHEMA)
    api.request("POST", "/v1/tenants", {"uid": "a"})
    for path in ("/v1/events", "/v1/tenants/a/events"):
        answer = api.request("POST", path, {"type": "order", "payload": payload})
        assert_error(answer, 422, mentions)
        assert "order" in answer.json()["error"]["message"]
    assert count(db, "events") == 0
    ok = api.request("POST", "/v1/events", {"type": "order", "payload": GOOD_ORDER})
    assert ok.status == 202, ok
    # A type with no schema, and a type not in the catalog, take any payload.
    make_type(api, "free-form")
    for event_type in ("free-form", "not.in.catalog"):
        assert api.request("POST", "/v1/events",
                           {"type": event_type, "payload": payload}).status == 202


def test_a_batch_names_the_failing_event_and_writes_nothing(
    api: IngressProcess, db: psycopg.Connection,
) -> None:
    make_type(api, "order", schema=ORDER_SCHEMA)
    events: list[dict[str, Any]] = [{"type": "order", "payload": GOOD_ORDER} for _ in range(5)]
    events[3] = {"type": "order", "payload": {"id": 2, "customer": {"tier": "x"}}}
    for path in ("/v1/events/batch", "/v1/tenants/default/events/batch"):
        assert_error(api.request("POST", path, {"events": events}), 422,
                     "events[3].payload.customer.tier: enum")
    assert count(db, "events") == 0
    events[3] = {"type": "order", "payload": GOOD_ORDER}
    assert api.request("POST", "/v1/events/batch", {"events": events}).status == 202
    assert count(db, "events") == 5


def test_a_deprecated_type_is_still_accepted(api: IngressProcess) -> None:
    make_type(api, "old", schema=ORDER_SCHEMA, deprecated=True)
    assert api.request("POST", "/v1/events", {"type": "old", "payload": GOOD_ORDER}
                       ).status == 202
    assert_error(api.request("POST", "/v1/events", {"type": "old", "payload": {}}), 422,
                 "payload: required")


@pytest.fixture
def strict_ingress(server: IngressProcess, module_dsn: str) -> Iterator[IngressProcess]:
    with IngressProcess(module_dsn, token=TOKEN, args=["--strict-event-types"]) as process:
        yield process


def test_strict_mode_refuses_unknown_types(api: IngressProcess, db: psycopg.Connection,
                                           strict_ingress: IngressProcess) -> None:
    make_type(api, "known")
    make_type(api, "old", deprecated=True)
    event = {"type": "unknown", "payload": {}}
    assert_error(strict_ingress.request("POST", "/v1/events", event), 422,
                 "'unknown' is not in the event-type catalog")
    assert_error(strict_ingress.request(
        "POST", "/v1/events/batch",
        {"events": [{"type": "known", "payload": {}}, event]}), 422, "events[1].type")
    assert count(db, "events") == 0
    for event_type in ("known", "old"):
        assert strict_ingress.request("POST", "/v1/events", {
            "type": event_type, "payload": {}}).status == 202
    # The same engine without the flag takes it; reserved types stay the engine's.
    assert api.request("POST", "/v1/events", event).status == 202
    assert_error(strict_ingress.request("POST", "/v1/events", {
        "type": "engine.delivery.dead", "payload": {}}), 422, "reserved")


@pytest.fixture
def second_ingress(server: IngressProcess, module_dsn: str) -> Iterator[IngressProcess]:
    with IngressProcess(module_dsn, token=TOKEN) as process:
        yield process


def test_a_change_reaches_every_ingress_process_within_a_second(
    api: IngressProcess, second_ingress: IngressProcess,
) -> None:
    bad = {"type": "order", "payload": {"id": 1}}
    assert second_ingress.request("POST", "/v1/events", bad).status == 202
    make_type(api, "order", schema=ORDER_SCHEMA)
    assert api.request("POST", "/v1/events", bad).status == 422  # the writer at once
    created_at = time.monotonic()
    while second_ingress.request("POST", "/v1/events", bad).status != 422:
        assert time.monotonic() - created_at < 1.0, "the second process never refused"
        time.sleep(0.02)
    assert api.request("DELETE", "/v1/event-types/order").status == 204
    deleted_at = time.monotonic()
    while second_ingress.request("POST", "/v1/events", bad).status != 202:
        assert time.monotonic() - deleted_at < 1.0, "the second process kept the schema"
        time.sleep(0.02)


# Payloads near the schema's edges: right and wrong types, tiers, lengths, missing keys.
_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2),
                    st.sampled_from(["free", "pro", "gold", "", "x" * 9]))
_customers = st.one_of(_values, st.fixed_dictionaries(
    {}, optional={"tier": _values, "email": _values}))
_orders = st.one_of(_values, st.lists(_values, max_size=2), st.fixed_dictionaries(
    {}, optional={"id": _values, "customer": _customers,
                  "items": st.one_of(_values, st.lists(_values, max_size=3))}))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=_orders)
def test_accepted_payloads_are_exactly_those_the_schema_validates(
    api: IngressProcess, db: psycopg.Connection, payload: object,
) -> None:
    """Whatever the payload, ingress accepts it exactly when the reference implementation
    (jsonschema, the Python library) says it is valid, and a refusal writes nothing."""
    if db.execute("SELECT count(*) FROM event_types").fetchone() == (0,):
        make_type(api, "order", schema=ORDER_SCHEMA)
    before = count(db, "events")
    answer = api.request("POST", "/v1/events", {"type": "order", "payload": payload})
    valid = jsonschema.Draft202012Validator(ORDER_SCHEMA).is_valid(payload)
    assert answer.status == (202 if valid else 422), (payload, answer)
    assert count(db, "events") == before + (1 if valid else 0)

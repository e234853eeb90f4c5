"""Routing by content (SPEC "Routing", issue 41) through the API of a real ingress process:
filters and channels stored, shown and patched; every invalid filter a 422 naming the
problem that writes nothing; events reaching exactly the destinations that admit them,
listed ones included; and a filter changed through one ingress process holding for the
next event accepted by another."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from engine.testing.ingress_server import IngressProcess
from tests.kit.api import assert_error, count, make_destination

GOLD = {"customer.tier": {"$eq": "gold"}, "items.0.qty": {"$gt": 1}}


def send(api: IngressProcess, payload: Any, **fields: Any) -> dict:
    answer = api.request("POST", "/v1/events", {"type": "order.created", "payload": payload,
                                                **fields})
    assert answer.status == 202, answer
    return answer.json()


def reached(db: psycopg.Connection, event_id: int) -> set[int]:
    rows = db.execute("SELECT destination_id FROM deliveries WHERE event_id = %s",
                      [event_id]).fetchall()
    return {int(r[0]) for r in rows}


def test_filter_and_channels_are_stored_shown_and_patched(api: IngressProcess) -> None:
    created = make_destination(api, filter=GOLD, channels=["eu", "eu", "orders"])
    assert created["filter"] == GOLD
    assert created["channels"] == ["eu", "orders"]  # duplicates dropped
    path = f"/v1/destinations/{created['id']}"
    shown = api.request("GET", path).json()
    assert (shown["filter"], shown["channels"]) == (GOLD, ["eu", "orders"])
    (listed,) = api.request("GET", "/v1/destinations").json()["data"]
    assert listed["filter"] == GOLD
    patched = api.request("PATCH", path, {"filter": {"a": {"$exists": True}}}).json()
    assert patched["filter"] == {"a": {"$exists": True}}
    assert patched["channels"] == ["eu", "orders"]  # left alone
    cleared = api.request("PATCH", path, {"filter": None, "channels": []}).json()
    assert (cleared["filter"], cleared["channels"]) == (None, None)
    assert make_destination(api, filter={})["filter"] is None  # no conditions: no filter


@pytest.mark.parametrize(("bad_filter", "mentions"), [
    ({"a": {"$regex": "x"}}, "unknown operator '$regex'"),
    ({"$nor": [{"a": {"$eq": 1}}]}, "unknown operator '$nor'"),
    ({"a..b": {"$eq": 1}}, "bad path 'a..b'"),
    ({".a": {"$eq": 1}}, "bad path '.a'"),
    ({"a.1234567890": {"$eq": 1}}, "bad path 'a.1234567890'"),
    ({"a": 1}, "filter.a: must be an object of operators"),
    ({"a": {"$gt": True}}, "filter.a.$gt: must be a number or a string"),
    ({"a": {"$eq": [1]}}, "filter.a.$eq: must be a string, a number"),
    ({"a": {"$in": []}}, "filter.a.$in: must be a non-empty list"),
    ({"a": {"$exists": 1}}, "filter.a.$exists: must be true or false"),
    ({"$and": []}, "filter.$and: must be a non-empty list"),
    ({"$or": [{}]}, "filter.$or[0]: must be a non-empty object"),
    ({"a": {"$eq": "x\u0000"}}, "NUL"),
])
def test_an_invalid_filter_is_422_naming_the_problem(
    api: IngressProcess, db: psycopg.Connection, bad_filter: dict, mentions: str,
) -> None:
    assert_error(api.request("POST", "/v1/destinations",
                             {"url": "http://127.0.0.1:9/x", "filter": bad_filter}),
                 422, mentions)
    assert count(db, "destinations") == 0
    kept = make_destination(api, filter={"k": {"$eq": 1}})
    assert_error(api.request("PATCH", f"/v1/destinations/{kept['id']}",
                             {"filter": bad_filter}), 422, mentions)
    assert api.request("GET", f"/v1/destinations/{kept['id']}").json()["filter"] == {
        "k": {"$eq": 1}}


def nested(depth: int) -> dict:
    document: dict = {"a": {"$eq": 1}}
    for _ in range(depth - 1):
        document = {"$not": document}
    return document


def test_nesting_and_size_limits(api: IngressProcess, db: psycopg.Connection) -> None:
    make_destination(api, filter=nested(10))
    assert_error(api.request("POST", "/v1/destinations",
                             {"url": "http://127.0.0.1:9/x", "filter": nested(11)}),
                 422, "nested deeper than 10")
    big = {"a": {"$in": ["x" * 100] * 41}}  # 4,1xx bytes
    assert_error(api.request("POST", "/v1/destinations",
                             {"url": "http://127.0.0.1:9/x", "filter": big}),
                 422, "over the limit of 4096")
    assert count(db, "destinations") == 1


@pytest.mark.parametrize("channels", [["bad name"], ["x" * 129], [f"c{n}" for n in range(11)],
                                      [""]])
def test_bad_channels_are_422(api: IngressProcess, db: psycopg.Connection,
                              channels: list[str]) -> None:
    assert_error(api.request("POST", "/v1/destinations",
                             {"url": "http://127.0.0.1:9/x", "channels": channels}), 422,
                 "channels")
    assert_error(api.request("POST", "/v1/events", {"type": "t", "payload": {},
                                                    "channels": channels}), 422, "channels")
    assert count(db, "destinations") == 0 and count(db, "events") == 0


def test_events_reach_exactly_the_destinations_that_admit_them(
    api: IngressProcess, db: psycopg.Connection,
) -> None:
    gold = make_destination(api, filter=GOLD)["id"]
    anyone = make_destination(api)["id"]
    eu = make_destination(api, channels=["eu"])["id"]
    eu_gold = make_destination(api, channels=["eu", "us"], filter=GOLD)["id"]
    typed = make_destination(api, event_types=["other"], filter=GOLD)["id"]
    gold_order = {"customer": {"tier": "gold"}, "items": [{"qty": 2}]}
    silver_order = {"customer": {"tier": "silver"}, "items": [{"qty": 2}]}

    event = send(api, gold_order)
    assert reached(db, event["id"]) == {gold, anyone, eu, eu_gold}
    assert event["deliveries"] == 4
    assert reached(db, send(api, silver_order)["id"]) == {anyone, eu}
    assert reached(db, send(api, gold_order, channels=["eu"])["id"]) == {eu, eu_gold}
    assert reached(db, send(api, silver_order, channels=["us", "apac"])["id"]) == set()
    assert reached(db, send(api, gold_order, channels=["apac"])["id"]) == set()
    # Compared by JSON type: "2" is not a number above 1, "gold " is not "gold".
    assert reached(db, send(api, {"customer": {"tier": "gold"},
                                  "items": [{"qty": "2"}]})["id"]) == {anyone, eu}
    # Listed destinations: the filter and channels still decide (SPEC: an event reaches a
    # destination only if its payload matches); event types are for fan-out only.
    listed = send(api, silver_order, destination_ids=[gold, anyone, typed])
    assert reached(db, listed["id"]) == {anyone}
    listed = send(api, gold_order, destination_ids=[gold, eu, typed], channels=["us"])
    assert reached(db, listed["id"]) == set()
    assert reached(db, send(api, gold_order, destination_ids=[typed])["id"]) == {typed}
    read = api.request("GET", f"/v1/events/{listed['id']}").json()
    assert read["channels"] == ["us"]


def test_payloads_jsonb_cannot_hold_match_no_filter_and_are_still_accepted(
    api: IngressProcess, db: psycopg.Connection,
) -> None:
    filtered = make_destination(api, filter={"a": {"$exists": True}})["id"]
    plain = make_destination(api)["id"]
    for text in ('{"a": "\\u0000"}', '{"a": 1e999999}', '{"a": 1.5e-16383}'):
        answer = api.request("POST", "/v1/events",
                             raw=b'{"type": "t", "payload": ' + text.encode() + b"}")
        assert answer.status == 202, answer
        assert reached(db, answer.json()["id"]) == {plain}
    assert reached(db, send(api, {"a": "\u00e9\U0001f600"})["id"]) == {filtered, plain}
    # jsonb holds these: they are filtered as any other.
    for text in ('{"a": 1e99999}', '{"a": "code12345 \\\\u0000"}', '{"a": 1e-16383}'):
        answer = api.request("POST", "/v1/events",
                             raw=b'{"type": "t", "payload": ' + text.encode() + b"}")
        assert answer.status == 202, answer
        assert reached(db, answer.json()["id"]) == {filtered, plain}, text


def test_channels_are_part_of_an_idempotent_request(api: IngressProcess) -> None:
    first = api.request("POST", "/v1/events", {"type": "t", "payload": {}, "channels": ["a"]},
                        headers={"Idempotency-Key": "k"})
    again = api.request("POST", "/v1/events", {"type": "t", "payload": {}, "channels": ["a"]},
                        headers={"Idempotency-Key": "k"})
    assert first.status == again.status == 202 and first.json() == again.json()
    other = api.request("POST", "/v1/events", {"type": "t", "payload": {}, "channels": ["b"]},
                        headers={"Idempotency-Key": "k"})
    assert_error(other, 409)


@pytest.fixture
def second_ingress(server: IngressProcess, module_dsn: str) -> Iterator[IngressProcess]:
    with IngressProcess(module_dsn) as process:
        yield process


def test_a_filter_change_holds_on_another_ingress_process_within_a_second(
    api: IngressProcess, second_ingress: IngressProcess, db: psycopg.Connection,
) -> None:
    destination = make_destination(api, filter={"n": {"$eq": 1}})["id"]
    assert reached(db, send(second_ingress, {"n": 1})["id"]) == {destination}
    assert api.request("PATCH", f"/v1/destinations/{destination}",
                       {"filter": {"n": {"$eq": 2}}}).status == 200
    changed_at = time.monotonic()
    # The first event the other process accepts after the change already obeys it.
    assert reached(db, send(second_ingress, {"n": 1})["id"]) == set()
    assert reached(db, send(second_ingress, {"n": 2})["id"]) == {destination}
    assert time.monotonic() - changed_at < 1.0

"""The destinations an event reaches, against SPEC's definitions (SPEC "Routing"; the
operators' meaning as engine/webhooks/routing.py states it), over generated payloads,
filters, channels and event types, through the real ingest path: an ingress process, its
group committer and enqueue_events.sql on a real PostgreSQL.

`admits` below is written from the SPEC's words, not from the engine's code: it walks the
payload as parsed JSON in Python, where the engine compiles to jsonpath and runs it in the
database. Each example is its own tenant, so examples share the server but not their
destinations."""

from __future__ import annotations

import itertools
import json
from decimal import Decimal
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.testing.ingress_server import IngressProcess

MISSING = object()
KEYS = ["a", "b", "é"]
SEGMENTS = [*KEYS, "0", "1"]
STRINGS = ["", "a", "b", "z", "Z", "é", "1", "true", "null", "a.b"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 1.0, 2.5, -0.0, 1e20]),
    st.sampled_from(STRINGS))
PAYLOADS = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
    max_leaves=12)
PATHS = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3).map(".".join)
ORDERED = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 2.5, 1e20]),
                    st.sampled_from(STRINGS))
CONDITION = st.one_of(
    st.tuples(st.sampled_from(["$eq", "$neq"]), SCALARS),
    st.tuples(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), ORDERED),
    st.tuples(st.sampled_from(["$in", "$nin"]), st.lists(SCALARS, min_size=1, max_size=3)),
    st.tuples(st.just("$exists"), st.booleans()),
)
OPERATORS = st.lists(CONDITION, min_size=1, max_size=2).map(dict)
FILTERS = st.recursive(
    st.dictionaries(PATHS, OPERATORS, min_size=1, max_size=3),
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["$and", "$or"]), st.lists(inner, min_size=1, max_size=3)),
        st.tuples(st.just("$not"), inner),
    ).map(lambda pair: {pair[0]: pair[1]}),
    max_leaves=6)
CHANNELS = st.one_of(st.none(), st.lists(st.sampled_from(["eu", "us", "apac"]), min_size=1,
                                         max_size=2, unique=True))
TYPES = ["t1", "t2"]
DESTINATIONS = st.lists(st.fixed_dictionaries({
    "filter": st.one_of(st.none(), FILTERS), "channels": CHANNELS,
    "event_types": st.sampled_from([None, ["t1"], ["t2"]]),
}), min_size=1, max_size=5)
EVENTS = st.lists(st.fixed_dictionaries({
    "type": st.sampled_from(TYPES), "payload": PAYLOADS, "channels": CHANNELS,
    "listed": st.one_of(st.none(), st.lists(st.integers(0, 4), min_size=1, unique=True)),
}), min_size=1, max_size=4)

_tenants = itertools.count(1)


# The SPEC's definitions -------------------------------------------------------------------


def resolve(payload: Any, path: str) -> Any:
    """The value at a dotted path, or MISSING: a numeric segment indexes an array."""
    value = payload
    for segment in path.split("."):
        if segment.isdigit():
            if not isinstance(value, list) or int(segment) >= len(value):
                return MISSING
            value = value[int(segment)]
        elif isinstance(value, dict) and segment in value:
            value = value[segment]
        else:
            return MISSING
    return value


def json_type(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return repr(value)[:4]  # "None", "True"/"Fals": null and booleans are their own
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def number(value: int | float) -> Decimal:
    """A number as the JSON text sent says it (json.dumps writes a float's repr)."""
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def equal(value: Any, wanted: Any) -> bool:
    if value is MISSING or isinstance(value, list | dict):
        return False
    if json_type(value) == "number" and json_type(wanted) == "number":
        return number(value) == number(wanted)
    if isinstance(value, bool) or isinstance(wanted, bool) or value is None or wanted is None:
        return value is wanted
    return type(value) is type(wanted) and value == wanted


def ordered(value: Any, operator: str, bound: Any) -> bool:
    if value is MISSING or json_type(value) != json_type(bound):
        return False
    if json_type(value) == "number":
        value, bound = number(value), number(bound)
    return {"$gt": value > bound, "$gte": value >= bound, "$lt": value < bound,
            "$lte": value <= bound}[operator]


def admits(document: dict, payload: Any) -> bool:
    for key, value in document.items():
        if key == "$and" and not all(admits(d, payload) for d in value):
            return False
        if key == "$or" and not any(admits(d, payload) for d in value):
            return False
        if key == "$not" and admits(value, payload):
            return False
        if key.startswith("$"):
            continue
        found = resolve(payload, key)
        if not all(holds(found, operator, operand) for operator, operand in value.items()):
            return False
    return True


def holds(found: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return equal(found, operand)
    if operator == "$neq":
        return not equal(found, operand)
    if operator == "$in":
        return any(equal(found, v) for v in operand)
    if operator == "$nin":
        return not any(equal(found, v) for v in operand)
    if operator == "$exists":
        return (found is not MISSING) == operand
    return ordered(found, operator, operand)


def expected(destinations: list[dict], event: dict) -> set[int]:
    reached = set()
    for n, destination in enumerate(destinations):
        if event["listed"] is not None:
            if n not in event["listed"]:
                continue
        elif destination["event_types"] not in (None, [event["type"]]):
            continue
        if event["channels"] and not set(event["channels"]) & set(destination["channels"]
                                                                   or ()):
            continue
        if destination["filter"] is not None and not admits(destination["filter"],
                                                            event["payload"]):
            continue
        reached.add(n)
    return reached


# Through the engine -------------------------------------------------------------------


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                   HealthCheck.too_slow])
@given(destinations=DESTINATIONS, events=EVENTS)
def test_an_event_reaches_exactly_the_destinations_spec_says(
    api: IngressProcess, db: psycopg.Connection, destinations: list[dict], events: list[dict],
) -> None:
    uid = f"p{next(_tenants)}"
    assert api.request("POST", "/v1/tenants", {"uid": uid}).status == 201
    base = f"/v1/tenants/{uid}"
    ids = []
    for destination in destinations:
        body = {"url": "http://127.0.0.1:9/p", **destination}
        made = api.request("POST", f"{base}/destinations", body)
        assert made.status == 201, (made, json.dumps(body))
        ids.append(made.json()["id"])
    for event in events:
        body = {"type": event["type"], "payload": event["payload"]}
        if event["channels"] is not None:
            body["channels"] = event["channels"]
        if event["listed"] is not None:
            body["destination_ids"] = [ids[n] for n in event["listed"] if n < len(ids)]
            event = {**event, "listed": [n for n in event["listed"] if n < len(ids)]}
        answer = api.request("POST", f"{base}/events", body)
        assert answer.status == 202, answer
        rows = db.execute("SELECT destination_id FROM deliveries WHERE event_id = %s",
                          [answer.json()["id"]]).fetchall()
        reached = {ids.index(int(r[0])) for r in rows}
        assert reached == expected(destinations, event), (destinations, event)

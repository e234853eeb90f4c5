"""Per-destination headers, retry_schedule and rate_limit, and the reserved `engine.` event
types, through the API of a real ingress process: accepted, shown on read, changed by
PATCH, and refused (422 naming the field, nothing written) when invalid."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.testing.ingress_server import IngressProcess
from engine.webhooks.destination_options import (
    REFUSED_HEADERS,
    OptionError,
    check_headers,
    check_retry_schedule,
    format_duration,
)
from tests.kit.api import assert_error, count, make_destination


def test_options_are_stored_shown_and_patched(api: IngressProcess) -> None:
    created = make_destination(
        api, headers={"X-Api-Key": "k1", "Authorization": "Bearer t"}, rate_limit=2.5,
        retry_schedule=["10s", "90s", "1h"],
    )
    assert created["headers"] == {"X-Api-Key": "k1", "Authorization": "Bearer t"}
    assert created["rate_limit"] == 2.5
    # Read back in the largest unit that says each delay exactly.
    assert created["retry_schedule"] == ["10s", "90s", "1h"]
    assert created["failing_since"] is None
    path = f"/v1/destinations/{created['id']}"
    shown = api.request("GET", path).json()
    assert (shown["headers"], shown["rate_limit"], shown["retry_schedule"]) == (
        created["headers"], 2.5, ["10s", "90s", "1h"])
    (listed,) = api.request("GET", "/v1/destinations").json()["data"]
    assert listed["headers"] == created["headers"]

    patched = api.request("PATCH", path, {"rate_limit": 100, "headers": {"X-Other": "v"}})
    assert patched.status == 200, patched
    body = patched.json()
    assert body["rate_limit"] == 100 and body["headers"] == {"X-Other": "v"}
    assert body["retry_schedule"] == ["10s", "90s", "1h"]  # left alone
    cleared = api.request(
        "PATCH", path, {"rate_limit": None, "headers": None, "retry_schedule": None}).json()
    assert (cleared["rate_limit"], cleared["headers"], cleared["retry_schedule"]) == (
        None, None, None)
    plain = make_destination(api)
    assert (plain["rate_limit"], plain["headers"], plain["retry_schedule"]) == (None, None, None)


@pytest.mark.parametrize(("fields", "mentions"), [
    ({"headers": {"webhook-signature": "v1,forged"}}, "headers['webhook-signature']"),
    ({"headers": {"Webhook-Id": "x"}}, "headers['Webhook-Id']"),
    ({"headers": {"Content-Type": "text/plain"}}, "headers['Content-Type']"),
    ({"headers": {"content-length": "1"}}, "headers['content-length']"),
    ({"headers": {"Host": "example.com"}}, "headers['Host']"),
    ({"headers": {"User-Agent": "me"}}, "headers['User-Agent']"),
    ({"headers": {"connection": "close"}}, "headers['connection']"),
    ({"headers": {"Transfer-Encoding": "chunked"}}, "headers['Transfer-Encoding']"),
    ({"headers": {"X-A": "one\r\nX-Injected: two"}}, "CR or LF"),
    ({"headers": {"X-A": "line\nbreak"}}, "headers['X-A']"),
    ({"headers": {"X-A": "x" * 1025}}, "headers"),
    ({"headers": {"X-A": "café"}}, "printable ASCII"),
    ({"headers": {"Bad Name": "v"}}, "headers"),
    ({"headers": {"X-A\n": "v"}}, "headers"),
    ({"headers": {"X-A": "1", "x-a": "2"}}, "given twice"),
    ({"headers": {f"X-{i}": "v" for i in range(21)}}, "headers"),
    ({"headers": {"X-A": 1}}, "headers"),
    ({"rate_limit": 0}, "rate_limit"),
    ({"rate_limit": -1}, "rate_limit"),
    ({"rate_limit": "fast"}, "rate_limit"),
    ({"retry_schedule": ["10x"]}, "retry_schedule[0]"),
    ({"retry_schedule": []}, "retry_schedule"),
    ({"retry_schedule": ["1m", "10s"]}, "retry_schedule[1]: delays must not decrease"),
    ({"retry_schedule": ["0s"]}, "retry_schedule[0]"),
])
def test_invalid_options_are_422_naming_the_field_and_write_nothing(
    api: IngressProcess, db: psycopg.Connection, fields: dict, mentions: str
) -> None:
    answer = api.request("POST", "/v1/destinations", {"url": "http://127.0.0.1:9/", **fields})
    assert_error(answer, 422, mentions)
    assert count(db, "destinations") == 0
    existing = make_destination(api, headers={"X-Keep": "1"}, rate_limit=3)
    path = f"/v1/destinations/{existing['id']}"
    assert_error(api.request("PATCH", path, fields), 422, mentions)
    kept = api.request("GET", path).json()
    assert kept["headers"] == {"X-Keep": "1"} and kept["rate_limit"] == 3


def test_engine_event_types_are_reserved(api: IngressProcess, db: psycopg.Connection) -> None:
    make_destination(api, event_types=["engine.delivery.dead"])  # subscribing is allowed
    for event_type in ("engine.delivery.dead", "engine.anything"):
        answer = api.request("POST", "/v1/events", {"type": event_type, "payload": {}})
        assert_error(answer, 422, "type")
        batch = api.request("POST", "/v1/events/batch", {"events": [
            {"type": "order.created", "payload": {}}, {"type": event_type, "payload": {}}]})
        assert_error(batch, 422, "reserved")
    assert count(db, "events") == 0 and count(db, "deliveries") == 0
    assert api.request("POST", "/v1/events", {"type": "engineering.done", "payload": {}}
                       ).status == 202


def test_openapi_documents_the_options(api: IngressProcess) -> None:
    schemas = api.request("GET", "/openapi.json").json()["components"]["schemas"]
    for name in ("DestinationCreate", "DestinationPatch", "Destination"):
        assert {"rate_limit", "headers", "retry_schedule"} <= set(schemas[name]["properties"])
    headers = schemas["DestinationCreate"]["properties"]["headers"]
    assert "webhook-*" in str(headers)
    assert "engine." in str(schemas["EventCreate"]["properties"]["type"])


# The checks themselves, for any input -------------------------------------------------

TOKEN_CHARS = "!#$%&'*+.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-"
names = st.text(TOKEN_CHARS, min_size=1, max_size=40)
values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=200)


@settings(max_examples=200)
@given(names, values)
def test_a_header_is_accepted_exactly_when_allowed(name: str, value: str) -> None:
    refused = name.lower().startswith("webhook-") or name.lower() in REFUSED_HEADERS
    try:
        assert check_headers({name: value}) == {name: value}
        assert not refused
    except OptionError as exc:
        assert refused, exc
        assert name in str(exc)


@settings(max_examples=200)
@given(names.filter(lambda n: n.lower() not in REFUSED_HEADERS),
       st.text(max_size=20), st.sampled_from(["\r", "\n", "\x00", "\x7f"]), st.text(max_size=20))
def test_control_characters_in_a_value_are_refused(
    name: str, before: str, control: str, after: str
) -> None:
    with pytest.raises(OptionError):
        check_headers({name: before + control + after})


@given(st.lists(st.floats(min_value=0.001, max_value=10 * 86400), min_size=1, max_size=10))
def test_a_shown_schedule_reads_back_as_the_same_delays(delays: list[float]) -> None:
    delays = sorted(round(d, 3) for d in delays)
    shown = [format_duration(d) for d in delays]
    assert check_retry_schedule(shown) == pytest.approx(delays)

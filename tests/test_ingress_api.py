"""Every endpoint of the ingress API, over real HTTP against a real ingress process."""

from __future__ import annotations

import datetime as dt
import json

import psycopg
import pytest

from engine.db.queue import Result
from engine.testing.ingress_server import IngressProcess
from tests.kit import queue_sync
from tests.kit.api import assert_error, count, make_destination
from tests.kit.dbserver import DatabaseFactory

TOKEN = "test-token"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture(scope="module")
def ingress_token() -> str:
    return TOKEN


# Auth ----------------------------------------------------------------------------------


def test_token_is_required_except_on_healthz(api: IngressProcess) -> None:
    refused = api.request("GET", "/v1/destinations", auth=False)
    assert_error(refused, 401)
    assert refused.headers["www-authenticate"] == "Bearer"
    wrong = {"Authorization": "Bearer nope"}
    assert_error(api.request("GET", "/v1/destinations", headers=wrong), 401)
    assert_error(api.request("GET", "/metrics", auth=False), 401)
    health = api.request("GET", "/healthz", auth=False)
    assert health.status == 200
    assert health.json() == {"status": "ok", "database": "ok"}
    assert api.request("GET", "/v1/destinations").status == 200


def test_unknown_path_and_method(api: IngressProcess) -> None:
    assert_error(api.request("GET", "/v1/nothing"), 404)
    assert_error(api.request("GET", "/v1/destinations/abc"), 404)
    assert_error(api.request("GET", "/v1/destinations/99999999999999999999"), 404)
    assert_error(api.request("PUT", "/v1/destinations"), 405)
    assert_error(api.request("DELETE", "/v1/events"), 405)


# Destinations --------------------------------------------------------------------------


def test_create_destination_generates_a_secret_shown_once(
    api: IngressProcess, db: psycopg.Connection
) -> None:
    created = make_destination(api, event_types=["order.created"], max_in_flight=4,
                               ordered=True, timeout_ms=5000)
    assert created["secret"].startswith("whsec_")
    assert created["url"] == "http://127.0.0.1:9/hook"
    assert created["event_types"] == ["order.created"]
    assert (created["max_in_flight"], created["ordered"], created["timeout_ms"]) == (4, True, 5000)
    assert created["breaker"] == "closed"
    assert created["consecutive_failures"] == 0
    assert created["paused_until"] is None
    assert created["disabled"] is False
    stored = db.execute("SELECT secret FROM destinations").fetchone()
    assert stored == (created["secret"],)

    read = api.request("GET", f"/v1/destinations/{created['id']}")
    assert read.status == 200
    assert "secret" not in read.json()
    listed = api.request("GET", "/v1/destinations")
    assert [d["id"] for d in listed.json()["data"]] == [created["id"]]
    assert created["secret"] not in listed.body.decode()


def test_create_destination_keeps_a_given_secret_and_default_timeout(
    api: IngressProcess,
) -> None:
    created = make_destination(api, secret=SECRET)
    assert created["secret"] == SECRET
    assert created["timeout_ms"] == 10_000
    assert created["event_types"] is None
    assert created["max_in_flight"] is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "ftp://example.com/"}, "url"),
        ({"url": "http://user:pw@example.com/"}, "url"),
        ({"url": "http://example.com/", "secret": "nope"}, "secret"),
        ({"url": "http://example.com/", "timeout_ms": 30_001}, "timeout_ms"),
        ({"url": "http://example.com/", "timeout_ms": 0}, "timeout_ms"),
        ({"url": "http://example.com/", "max_in_flight": 10_001}, "max_in_flight"),
        ({"url": "http://example.com/", "colour": "red"}, "colour"),
        ({"url": 5}, "url"),
        ({}, "url"),
    ],
)
def test_create_destination_refusals_name_the_field(
    api: IngressProcess, db: psycopg.Connection, body: dict, field: str
) -> None:
    assert_error(api.request("POST", "/v1/destinations", body), 422, field)
    assert count(db, "destinations") == 0


def test_private_targets_are_refused_without_the_flag(module_dsn: str) -> None:
    strict_process = IngressProcess(module_dsn)
    strict_process.argv.remove("--allow-private-targets")
    with strict_process as strict:
        for url in ("http://127.0.0.1/", "http://localhost/", "http://2130706433/",
                    "http://[::ffff:127.0.0.1]/", "http://10.0.0.1/"):
            assert_error(strict.request("POST", "/v1/destinations", {"url": url}), 422, "url")
        ok = strict.request("POST", "/v1/destinations", {"url": "https://93.184.215.14/x"})
        assert ok.status == 201, ok


def test_patch_destination(api: IngressProcess, db: psycopg.Connection) -> None:
    created = make_destination(api, secret=SECRET, event_types=["a"], max_in_flight=3)
    path = f"/v1/destinations/{created['id']}"
    changed = api.request("PATCH", path, {
        "url": "http://127.0.0.1:10/other", "event_types": None, "max_in_flight": None,
        "ordered": True, "timeout_ms": 2000, "paused": True,
    })
    assert changed.status == 200, changed
    body = changed.json()
    assert body["url"] == "http://127.0.0.1:10/other"
    assert (body["event_types"], body["max_in_flight"]) == (None, None)
    assert (body["ordered"], body["timeout_ms"], body["paused"]) == (True, 2000, True)
    assert "secret" not in body

    # A field left out keeps its value.
    again = api.request("PATCH", path, {"disabled": True}).json()
    assert again["url"] == "http://127.0.0.1:10/other"
    assert again["disabled"] is True
    assert again["paused"] is True

    # Resuming closes the breaker.
    db.execute(
        "UPDATE destinations SET breaker = 'open', paused_until = now() + interval '1 h',"
        " consecutive_failures = 7, breaker_pause_ms = 60000"
    )
    resumed = api.request("PATCH", path, {"paused": False, "disabled": False}).json()
    assert (resumed["breaker"], resumed["paused_until"]) == ("closed", None)
    assert resumed["consecutive_failures"] == 0
    assert (resumed["paused"], resumed["disabled"]) == (False, False)

    assert_error(api.request("PATCH", path, {"timeout_ms": 999_999}), 422, "timeout_ms")
    assert_error(api.request("PATCH", path, {"url": "gopher://x/"}), 422, "url")
    assert_error(api.request("PATCH", path, {"secret": "x"}), 422, "secret")
    assert_error(api.request("PATCH", "/v1/destinations/999", {"paused": True}), 404)


def test_rotate_secret_keeps_the_previous_one_for_a_day(
    api: IngressProcess, db: psycopg.Connection
) -> None:
    created = make_destination(api, secret=SECRET)
    rotated = api.request("PATCH", f"/v1/destinations/{created['id']}",
                          {"rotate_secret": True}).json()
    assert rotated["secret"].startswith("whsec_")
    assert rotated["secret"] != SECRET
    row = db.execute(
        "SELECT secret, previous_secret, previous_secret_until - now() FROM destinations"
    ).fetchone()
    assert row is not None
    assert row[0] == rotated["secret"]
    assert row[1] == SECRET
    assert dt.timedelta(hours=23) < row[2] <= dt.timedelta(hours=24)


def test_delete_destination_is_soft_and_stops_fan_out(
    api: IngressProcess, db: psycopg.Connection
) -> None:
    kept = make_destination(api)
    gone = make_destination(api)
    first = api.request("POST", "/v1/events", {"type": "t", "payload": {}})
    assert first.json()["deliveries"] == 2
    assert api.request("DELETE", f"/v1/destinations/{gone['id']}").status == 204
    assert_error(api.request("DELETE", f"/v1/destinations/{gone['id']}"), 404)
    assert_error(api.request("GET", f"/v1/destinations/{gone['id']}"), 404)
    assert [d["id"] for d in api.request("GET", "/v1/destinations").json()["data"]] == [
        kept["id"]
    ]
    # Its delivery is kept, but the claim (which checks deleted_at) does not hand it out.
    assert count(db, "deliveries") == 2
    claimed = queue_sync.claim_batch(db, "w", 10, 60_000)
    assert [c.destination_id for c in claimed] == [kept["id"]]
    assert count(db, "deliveries") == 2
    second = api.request("POST", "/v1/events", {"type": "t", "payload": {}})
    assert second.json()["deliveries"] == 1
    refused = api.request("POST", "/v1/events",
                          {"type": "t", "payload": 1, "destination_ids": [gone["id"]]})
    assert_error(refused, 422, "destination_ids")


# Events --------------------------------------------------------------------------------


def test_create_event_fans_out_and_keeps_payload_bytes(
    api: IngressProcess, db: psycopg.Connection
) -> None:
    everything = make_destination(api)
    orders = make_destination(api, event_types=["order.created"])
    make_destination(api, event_types=["user.deleted"])
    payload = b'{"b" : 1,  "a":[1.50, "\\u00e9"],"z":null}'
    raw = b'{"type": "order.created", "payload": ' + payload + b"}"
    answer = api.request("POST", "/v1/events", raw=raw)
    assert answer.status == 202, answer
    accepted = answer.json()
    assert set(accepted) == {"id", "deliveries"}
    assert accepted["deliveries"] == 2
    stored = db.execute("SELECT payload FROM events WHERE id = %s", [accepted["id"]]).fetchone()
    assert stored == (payload.decode(),)
    targets = db.execute(
        "SELECT destination_id FROM deliveries WHERE event_id = %s ORDER BY 1", [accepted["id"]]
    ).fetchall()
    assert targets == [(everything["id"],), (orders["id"],)]

    read = api.request("GET", f"/v1/events/{accepted['id']}")
    assert read.status == 200
    assert payload in read.body  # the exact text comes back, not a re-encoding
    event = read.json()
    assert event["type"] == "order.created"
    assert sorted(d["destination_id"] for d in event["deliveries"]) == [
        everything["id"], orders["id"]
    ]
    assert all(d["status"] == "pending" for d in event["deliveries"])
    assert_error(api.request("GET", "/v1/events/424242"), 404)


def test_create_event_to_listed_destinations(api: IngressProcess, db: psycopg.Connection) -> None:
    first = make_destination(api, event_types=["other"])
    make_destination(api)
    answer = api.request("POST", "/v1/events", {
        "type": "t", "payload": "text", "destination_ids": [first["id"], first["id"]],
        "ordering_key": "k1",
    })
    assert answer.status == 202, answer
    assert answer.json()["deliveries"] == 1
    assert_error(
        api.request("POST", "/v1/events",
                    {"type": "t", "payload": 1, "destination_ids": [first["id"], 777]}),
        422, "destination_ids",
    )
    assert count(db, "events") == 1


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"{", 400),
        (b"", 400),
        (b'{"type": "t", "payload": "\xff"}', 400),
        (b"[]", 422),
        (b'{"type": "t"}', 422),
        (b'{"payload": 1}', 422),
        (b'{"type": "", "payload": 1}', 422),
        (b'{"type": "t", "payload": 1, "extra": 1}', 422),
        (b'{"type": "t\\u0000", "payload": 1}', 422),
        (b'{"type": "t", "payload": 1, "destination_ids": [0]}', 422),
        (b'{"type": "t", "payload": 1, "destination_ids": [9223372036854775808]}', 422),
        (b'{"type": "t", "payload": 1, "destination_ids": "1"}', 422),
        (b'{"type": "t", "payload": 1, "ordering_key": 5}', 422),
    ],
)
def test_bad_event_bodies_write_nothing(
    api: IngressProcess, db: psycopg.Connection, raw: bytes, status: int
) -> None:
    make_destination(api)
    assert_error(api.request("POST", "/v1/events", raw=raw), status)
    assert count(db, "events") == 0


def test_body_over_the_limit_is_413(api: IngressProcess, db: psycopg.Connection) -> None:
    make_destination(api)
    big = b'{"type": "t", "payload": "' + b"x" * (256 * 1024) + b'"}'
    assert_error(api.request("POST", "/v1/events", raw=big), 413)
    assert_error(api.request("POST", "/v1/events", raw=big, chunked=True), 413)
    just_fits = b'{"type": "t", "payload": "' + b"x" * (256 * 1024 - 40) + b'"}'
    assert api.request("POST", "/v1/events", raw=just_fits).status == 202
    assert api.request("POST", "/v1/events", raw=just_fits, chunked=True).status == 202
    assert count(db, "events") == 2


def test_idempotency_key(api: IngressProcess, db: psycopg.Connection) -> None:
    make_destination(api)
    key = {"Idempotency-Key": "order-1"}
    body = {"type": "t", "payload": {"n": 1}}
    first = api.request("POST", "/v1/events", body, headers=key)
    assert first.status == 202
    again = api.request("POST", "/v1/events", body, headers=key)
    assert again.status == 202
    assert again.json() == first.json()
    changed = api.request("POST", "/v1/events", {"type": "t", "payload": {"n": 2}}, headers=key)
    assert_error(changed, 409, "Idempotency-Key")
    assert count(db, "events") == 1
    assert count(db, "deliveries") == 1


def test_batch_is_all_or_nothing(api: IngressProcess, db: psycopg.Connection) -> None:
    destination = make_destination(api)
    events = [{"type": "t", "payload": {"i": i}} for i in range(5)]
    events[2]["idempotency_key"] = "batch-2"
    answer = api.request("POST", "/v1/events/batch", {"events": events})
    assert answer.status == 202, answer
    data = answer.json()["data"]
    assert [d["deliveries"] for d in data] == [1] * 5
    ids = [d["id"] for d in data]
    assert ids == sorted(ids)
    stored = db.execute("SELECT id, payload FROM events ORDER BY id").fetchall()
    assert stored == [(ids[i], json.dumps({"i": i})) for i in range(5)]

    # A repeated key with the same event answers with the first id and writes nothing.
    repeat = api.request("POST", "/v1/events/batch", {"events": [events[2]]})
    assert repeat.json()["data"] == [data[2]]
    # One bad event refuses the whole batch.
    bad = [{"type": "t", "payload": 1}, {"type": "t", "payload": 2,
                                          "destination_ids": [destination["id"] + 100]}]
    assert_error(api.request("POST", "/v1/events/batch", {"events": bad}), 422,
                 "destination_ids")
    reused = [{"type": "t", "payload": 1}, {**events[2], "payload": "different"}]
    assert_error(api.request("POST", "/v1/events/batch", {"events": reused}), 409)
    too_many = {"events": [{"type": "t", "payload": 1}] * 1001}
    assert_error(api.request("POST", "/v1/events/batch", too_many), 422, "events")
    assert_error(api.request("POST", "/v1/events/batch", {"events": []}), 422)
    assert count(db, "events") == 5


# Deliveries ----------------------------------------------------------------------------


def finish(db: psycopg.Connection, outcome: str) -> list[int]:
    """Claim everything due and record `outcome` for it, as a worker would."""
    claims = queue_sync.claim_batch(db, "test:1", 1000, 60_000)
    started = dt.datetime.now(dt.UTC)
    queue_sync.record_results(db, "test:1", [
        Result(c.id, c.attempt, outcome, started, 5, 500, "boom", "body") for c in claims
    ])
    return [c.id for c in claims]


def test_list_deliveries_pages_newest_first_across_tables(
    api: IngressProcess, db: psycopg.Connection
) -> None:
    first = make_destination(api)
    second = make_destination(api, event_types=["only-second"])
    events = [{"type": "t", "payload": i} for i in range(6)]
    api.request("POST", "/v1/events/batch", {"events": events})
    assert len(finish(db, "dead")) == 6
    api.request("POST", "/v1/events/batch",
                {"events": [{"type": "only-second", "payload": 0}] * 3})
    all_ids: list[int] = []
    cursor = None
    while True:
        path = "/v1/deliveries?limit=4" + (f"&after={cursor}" if cursor else "")
        page = api.request("GET", path).json()
        all_ids += [d["id"] for d in page["data"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert len(all_ids) == 6 + 2 * 3
    assert all_ids == sorted(all_ids, reverse=True)

    dead_page = api.request("GET", "/v1/deliveries?status=dead&limit=1000").json()
    assert len(dead_page["data"]) == 6
    assert all(d["status"] == "dead" and d["completed_at"] for d in dead_page["data"])
    assert dead_page["next"] is None
    second_pending = api.request(
        "GET", f"/v1/deliveries?destination_id={second['id']}&status=pending"
    ).json()["data"]
    assert len(second_pending) == 3
    assert {d["destination_id"] for d in second_pending} == {second["id"]}
    first_all = api.request("GET", f"/v1/deliveries?destination_id={first['id']}").json()
    assert len(first_all["data"]) == 9

    for query in ("limit=0", "limit=1001", "status=lost", "after=x", "destination_id=-1",
                  "colour=red", "limit=1&limit=2"):
        assert_error(api.request("GET", f"/v1/deliveries?{query}"), 422)


def test_read_delivery_with_attempts_and_replay(
    api: IngressProcess, db: psycopg.Connection
) -> None:
    destination = make_destination(api)
    api.request("POST", "/v1/events", {"type": "t", "payload": 1})
    [delivery_id] = finish(db, "dead")
    read = api.request("GET", f"/v1/deliveries/{delivery_id}")
    assert read.status == 200
    delivery = read.json()
    assert (delivery["status"], delivery["attempt"], delivery["last_error"]) == (
        "dead", 1, "boom"
    )
    assert delivery["destination_id"] == destination["id"]
    [attempt] = delivery["attempts"]
    assert (attempt["attempt"], attempt["status_code"], attempt["duration_ms"]) == (1, 500, 5)
    assert attempt["error"] == "boom"

    replayed = api.request("POST", f"/v1/deliveries/{delivery_id}/replay")
    assert replayed.status == 202, replayed
    assert (replayed.json()["status"], replayed.json()["attempt"]) == ("pending", 0)
    claims = queue_sync.claim_batch(db, "test:1", 10, 60_000)
    assert [c.id for c in claims] == [delivery_id]
    assert_error(api.request("POST", f"/v1/deliveries/{delivery_id}/replay"), 409)
    assert_error(api.request("POST", "/v1/deliveries/987654/replay"), 404)
    assert_error(api.request("GET", "/v1/deliveries/987654"), 404)


def test_replay_dead_deliveries_of_a_destination(
    api: IngressProcess, db: psycopg.Connection
) -> None:
    destination = make_destination(api)
    api.request("POST", "/v1/events/batch", {"events": [{"type": "t", "payload": 1}] * 7})
    finish(db, "dead")
    path = f"/v1/destinations/{destination['id']}/replay"
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    none = api.request("POST", path, {"status": "dead", "since": future})
    assert none.status == 202
    assert none.json() == {"replayed": 0}
    answer = api.request("POST", path, {"status": "dead"})
    assert answer.json() == {"replayed": 7}
    assert count(db, "finished_deliveries") == 0
    assert count(db, "deliveries WHERE attempt = 0 AND status = 'pending'") == 7
    assert_error(api.request("POST", path, {"status": "delivered"}), 422, "status")
    assert_error(api.request("POST", path, {"status": "dead", "since": "2024-01-01"}), 422)
    assert_error(api.request("POST", "/v1/destinations/999/replay", {"status": "dead"}), 404)


# Operations ----------------------------------------------------------------------------


def test_metrics_and_openapi(api: IngressProcess) -> None:
    make_destination(api)
    api.request("POST", "/v1/events", {"type": "t", "payload": 1})
    metrics = api.request("GET", "/metrics")
    assert metrics.status == 200
    text = metrics.body.decode()
    assert 'engine_ingress_requests_total{route="create_event",status="202"}' in text
    assert "engine_ingress_commit_requests_bucket" in text
    document = api.request("GET", "/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert "/v1/events/batch" in document["paths"]
    assert "EventCreate" in document["components"]["schemas"]


def test_database_down_is_503(database_factory: DatabaseFactory) -> None:
    url = database_factory.create()
    with IngressProcess(url) as process:
        assert process.request("GET", "/healthz").status == 200
        database_factory.drop(url)  # terminates the ingress connections and removes the DB
        assert_error(process.request("POST", "/v1/events", {"type": "t", "payload": 1}), 503)
        assert_error(process.request("GET", "/healthz"), 503)
        assert_error(process.request("GET", "/v1/destinations"), 503)


def test_batch_body_may_exceed_the_request_limit_but_not_each_payload(
    api: IngressProcess, db: psycopg.Connection
) -> None:
    make_destination(api)
    big = "x" * (200 * 1024)
    fits = api.request("POST", "/v1/events/batch",
                       {"events": [{"type": "t", "payload": big}] * 2})
    assert fits.status == 202, fits
    over = api.request("POST", "/v1/events/batch",
                       {"events": [{"type": "t", "payload": 1},
                                   {"type": "t", "payload": big + big}]})
    assert_error(over, 413, "events[1].payload")
    assert count(db, "events") == 2

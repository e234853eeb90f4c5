"""The console's endpoints over real HTTP against a real ingress process: GET /v1/events,
GET /v1/deliveries?event_type=&since=&until=, GET /v1/destinations/{id}/stats,
GET /v1/overview, and the static page."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from engine.db import queue
from engine.db.queue import Result
from engine.testing.ingress_server import IngressProcess
from tests.kit import queue_sync
from tests.kit.api import assert_error, make_destination

TOKEN = "console-token"


@pytest.fixture(scope="module")
def ingress_token() -> str:
    return TOKEN


def pages(api: IngressProcess, path: str, limit: int) -> list[dict]:
    """Every item of a keyset-paged list, following `next` to the end."""
    items: list[dict] = []
    cursor = None
    separator = "&" if "?" in path else "?"
    while True:
        page = api.request(
            "GET", f"{path}{separator}limit={limit}" + (f"&after={cursor}" if cursor else "")
        ).json()
        assert len(page["data"]) <= limit
        items += page["data"]
        cursor = page["next"]
        if cursor is None:
            return items


def record(db: psycopg.Connection, outcomes: dict[int, tuple[str, int | None, int]]) -> None:
    """Claim everything due and record, per destination id, (outcome, status code,
    duration ms), as a worker would."""
    claims = queue_sync.claim_batch(db, "test:1", 1000, 60_000)
    started = dt.datetime.now(dt.UTC)
    results = []
    for c in claims:
        outcome, code, duration = outcomes[c.destination_id]
        error = None if outcome == "delivered" else (f"HTTP {code}" if code else "timed out")
        later = started + dt.timedelta(minutes=5) if outcome == "retry" else None
        results.append(Result(c.id, c.attempt, outcome, started, duration, code, error,
                              "<script>alert(1)</script>", later))
    queue_sync.record_results(db, "test:1", results)


def set_created(db: psycopg.Connection, event_ids: list[int], at: dt.datetime) -> None:
    """Move events in time with their deliveries, whose created_at is their event's (the
    claim finds the event by both, claim_batch.sql)."""
    db.execute("UPDATE events SET created_at = %s WHERE id = ANY(%s)", (at, event_ids))
    db.execute("UPDATE deliveries SET created_at = %s WHERE event_id = ANY(%s)", (at, event_ids))


def test_events_list_newest_first_by_type_and_time(
    api: IngressProcess, db: psycopg.Connection
) -> None:
    make_destination(api)
    batch = [{"type": "a" if i % 3 else "b", "payload": i} for i in range(12)]
    ids = [e["id"] for e in api.request("POST", "/v1/events/batch", {"events": batch})
           .json()["data"]]
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    # Times out of id order, with ties: the list orders by (created_at, id), not by id.
    for n, event_id in enumerate(ids):
        set_created(db, [event_id], base + dt.timedelta(minutes=(n * 7) % 5))
    expected = sorted(
        ((base + dt.timedelta(minutes=(n * 7) % 5), event_id) for n, event_id in
         enumerate(ids)), reverse=True)
    listed = pages(api, "/v1/events", 5)
    assert [e["id"] for e in listed] == [event_id for _, event_id in expected]
    assert "payload" not in listed[0] and listed[0]["delivery_count"] == 1

    of_b = pages(api, "/v1/events?type=b", 2)
    assert [e["id"] for e in of_b] == [i for _, i in expected if batch[ids.index(i)]["type"]
                                       == "b"]
    since, until = base + dt.timedelta(minutes=1), base + dt.timedelta(minutes=3)
    window = pages(api, f"/v1/events?since={since.isoformat().replace('+00:00', 'Z')}"
                        f"&until={until.isoformat().replace('+00:00', 'Z')}", 3)
    assert [e["id"] for e in window] == [i for at, i in expected if since <= at <= until]

    for query in ("since=yesterday", "since=2026-01-01T00:00:00", "limit=0", "after=x",
                  "type=", "colour=red"):
        assert_error(api.request("GET", f"/v1/events?{query}"), 422)
    assert_error(api.request("GET", "/v1/events", auth=False), 401)


def test_deliveries_by_event_type_and_time_page_exactly(
    api: IngressProcess, db: psycopg.Connection
) -> None:
    first = make_destination(api)
    second = make_destination(api)
    batch = [{"type": "order" if i % 2 else "user", "payload": i} for i in range(10)]
    ids = [e["id"] for e in api.request("POST", "/v1/events/batch", {"events": batch})
           .json()["data"]]
    base = dt.datetime(2026, 2, 1, tzinfo=dt.UTC)
    for n, event_id in enumerate(ids):
        set_created(db, [event_id], base + dt.timedelta(minutes=n % 4))
    record(db, {first["id"]: ("dead", 500, 3), second["id"]: ("delivered", 200, 2)})
    rows = db.execute(
        "SELECT d.id, d.destination_id, d.status::text, e.type, e.created_at, e.id"
        "  FROM finished_deliveries d JOIN events e ON e.id = d.event_id"
    ).fetchall()
    expected = sorted(rows, key=lambda r: (r[4], r[5], r[0]), reverse=True)

    orders = pages(api, "/v1/deliveries?event_type=order", 3)
    assert [d["id"] for d in orders] == [r[0] for r in expected if r[3] == "order"]
    dead_orders = pages(
        api, f"/v1/deliveries?event_type=order&status=dead&destination_id={first['id']}", 2)
    assert [d["id"] for d in dead_orders] == [
        r[0] for r in expected if r[3] == "order" and r[2] == "dead" and r[1] == first["id"]]
    assert dead_orders and all(d["status"] == "dead" for d in dead_orders)
    since = (base + dt.timedelta(minutes=2)).isoformat().replace("+00:00", "Z")
    recent = pages(api, f"/v1/deliveries?since={since}", 4)
    assert [d["id"] for d in recent] == [r[0] for r in expected if r[4] >= base +
                                         dt.timedelta(minutes=2)]
    assert pages(api, "/v1/deliveries?event_type=nothing-of-this-type", 10) == []
    assert_error(api.request("GET", "/v1/deliveries?until=soon"), 422)


def test_destination_stats_count_outcomes_and_percentiles(
    api: IngressProcess, db: psycopg.Connection
) -> None:
    failing = make_destination(api)
    healthy = make_destination(api)
    api.request("POST", "/v1/events/batch", {"events": [{"type": "t", "payload": i}
                                                        for i in range(4)]})
    record(db, {failing["id"]: ("retry", 503, 40), healthy["id"]: ("delivered", 200, 10)})
    db.execute("UPDATE deliveries SET next_attempt_at = now()")
    record(db, {failing["id"]: ("dead", None, 1000), healthy["id"]: ("delivered", 200, 10)})

    stats = api.request("GET", f"/v1/destinations/{failing['id']}/stats?window=1h").json()
    assert (stats["attempts"], stats["succeeded"], stats["http_error"],
            stats["transport_error"]) == (8, 0, 4, 4)
    # Percentiles come from the rollup's histogram: each within the bucket of the exact
    # value, and never outside the durations seen. p50 lies between the 4th (40) and 5th
    # (1000) durations; p90 and p99 in the bucket of 1000 ms (862..1023).
    assert 40 <= stats["p50_ms"] <= 1000
    assert 862 <= stats["p90_ms"] <= stats["p99_ms"] <= 1000
    assert (stats["dead"], stats["pending"], stats["window_s"]) == (4, 0, 3600.0)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    none_since = api.request(
        "GET", f"/v1/destinations/{failing['id']}/stats?dead_since="
               f"{later.isoformat().replace('+00:00', 'Z')}").json()
    assert none_since["dead"] == 0
    ok = api.request("GET", f"/v1/destinations/{healthy['id']}/stats").json()
    assert (ok["attempts"], ok["succeeded"], ok["p99_ms"]) == (4, 4, 10.0)

    # A lost attempt (a worker died holding the claim) counts too, without an answer.
    api.request("POST", "/v1/events", {"type": "t", "payload": 0,
                                       "destination_ids": [healthy["id"]]})
    assert len(queue_sync.claim_batch(db, "test:lost", 10, 60_000)) == 1
    assert queue.release_claims(db, "test:lost", 10) == 1
    lost = api.request("GET", f"/v1/destinations/{healthy['id']}/stats").json()
    assert (lost["attempts"], lost["transport_error"], lost["pending"]) == (5, 1, 1)

    for query in ("window=0s", "window=2d", "window=soon", "dead_since=now"):
        assert_error(api.request("GET", f"/v1/destinations/{failing['id']}/stats?{query}"),
                     422)
    assert_error(api.request("GET", "/v1/destinations/987654/stats"), 404)


def test_overview_matches_the_database(api: IngressProcess, db: psycopg.Connection) -> None:
    failing = make_destination(api)
    healthy = make_destination(api)
    api.request("POST", "/v1/events/batch", {"events": [{"type": "t", "payload": i}
                                                        for i in range(3)]})
    record(db, {failing["id"]: ("dead", 500, 30), healthy["id"]: ("delivered", 200, 5)})
    api.request("POST", "/v1/events", {"type": "t", "payload": 9})

    overview = api.request("GET", "/v1/overview").json()
    assert (overview["queue"]["pending"], overview["queue"]["dead"]) == (2, 3)
    assert len(overview["per_minute"]) == 60
    assert sum(m["succeeded"] for m in overview["per_minute"]) == 3
    assert sum(m["failed"] for m in overview["per_minute"]) == 3
    by_id = {d["id"]: d for d in overview["destinations"]}
    assert (by_id[failing["id"]]["attempts"], by_id[failing["id"]]["succeeded"]) == (3, 0)
    assert by_id[failing["id"]]["last_error"] == "HTTP 500"
    assert (by_id[healthy["id"]]["succeeded"], by_id[healthy["id"]]["pending"]) == (3, 1)
    assert isinstance(overview["warnings"], list)
    assert_error(api.request("GET", "/v1/overview?window=forever"), 422)
    assert_error(api.request("GET", "/v1/overview", auth=False), 401)


def test_console_is_served_without_a_token_with_a_strict_policy(api: IngressProcess) -> None:
    page = api.request("GET", "/console", auth=False)
    assert page.status == 200
    assert page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert b"/console/console.js" in page.body
    for name in ("console.js", "console_pages.js", "console.css"):
        asset = api.request("GET", f"/console/{name}", auth=False)
        assert asset.status == 200 and asset.body, name
        assert asset.headers["x-content-type-options"] == "nosniff"
    # The script never hands server data to the HTML parser.
    script = (api.request("GET", "/console/console.js", auth=False).body
              + api.request("GET", "/console/console_pages.js", auth=False).body)
    assert b"innerHTML" not in script and b"insertAdjacentHTML" not in script
    assert_error(api.request("GET", "/console/other.js", auth=False), 404)
    document = api.request("GET", "/openapi.json").json()
    for path in ("/v1/overview", "/v1/destinations/{id}/stats", "/console"):
        assert path in document["paths"]
    assert "get" in document["paths"]["/v1/events"]

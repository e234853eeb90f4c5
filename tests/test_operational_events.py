"""Operational events and auto-disable end to end: a real engine delivering to the fake
destination, subscribers receiving engine.* events through the ordinary pipeline (signed),
never about themselves, and no event about the deliveries of operational events."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import psycopg
from standardwebhooks import Webhook

from engine.observe.operational_events import EVENT_TYPES
from engine.testing.fakedest import FakeDestination
from engine.testing.ingress_server import IngressProcess
from engine.webhooks.signing import generate_secret
from tests.kit.data import add_destination, count, enqueue
from tests.kit.enginerun import Engine, wait_until
from tests.kit.workers import SCHEDULE


def engine_with(dsn: str, tmp_path: Path, settings: str) -> Engine:
    path = tmp_path / "engine.toml"
    path.write_text(settings)
    return Engine(dsn, tmp_path, "--config", str(path), "--allow-private-targets",
                  "--retry-schedule", SCHEDULE, "--bind", "127.0.0.1:0", "--procs", "2")


def received(fake: FakeDestination, name: str, secret: str) -> list[dict]:
    verifier = Webhook(secret)
    payloads = []
    for request in fake.requests(name):
        verifier.verify(request["body"], request["headers"])
        payloads.append(json.loads(request["body"]))
    return payloads


def of_type(payloads: list[dict], event_type: str) -> list[dict]:
    return [p for p in payloads if p["type"] == event_type]


def test_state_changes_reach_subscribers_and_never_the_destination_they_are_about(
    conn: psycopg.Connection, dsn: str, tmp_path: Path
) -> None:
    secret = generate_secret()
    with FakeDestination() as fake:
        subscriber = add_destination(conn, url=fake.url("fast/sub"), secret=secret,
                                     event_types=list(EVENT_TYPES))
        # A subscriber that fails everything it is sent: its breaker opens on deliveries
        # of operational events alone, which announces nothing (two such subscribers
        # would tell each other about their breakers for ever), and its dead deliveries
        # cause no engine.delivery.dead.
        fake.control("failing-sub", "fail", 500)
        failing_sub = add_destination(conn, url=fake.url("toggle/failing-sub"),
                                      event_types=list(EVENT_TYPES), retry_schedule=[0.1])
        gone = add_destination(conn, url=fake.url("status/410/gone"))
        fake.control("flapping", "fail", 500)
        flapping = add_destination(conn, url=fake.url("toggle/flapping"))
        dying = add_destination(conn, url=fake.url("status/500/dying"),
                                retry_schedule=[0.1])
        enqueue(conn, ['{"n": 1}'], [gone])
        enqueue(conn, ['{"n": 1}'], [dying])
        enqueue(conn, [f'{{"n": {i}}}' for i in range(3)], [flapping])
        settings = ("breaker_threshold = 2\nbreaker_base_pause_ms = 300\n"
                    "breaker_max_pause_ms = 600\n")
        with engine_with(dsn, tmp_path, settings):
            wait_until(lambda: of_type(received(fake, "sub", secret),
                                       "engine.destination.breaker_opened"), 30,
                       "breaker_opened")
            fake.control("flapping", "ok")
            wait_until(lambda: of_type(received(fake, "sub", secret),
                                       "engine.destination.recovered"), 30, "recovered")
            wait_until(lambda: {p["type"] for p in received(fake, "sub", secret)}
                       >= set(EVENT_TYPES), 30, "all four types")
            wait_until(lambda: count(conn, "SELECT count(*) FROM destinations WHERE id = %s"
                                           " AND breaker_opened_at IS NOT NULL",
                                     failing_sub) == 1, 30, "the failing subscriber's breaker")
            wait_until(lambda: count(conn, "SELECT count(*) FROM deliveries d JOIN events e"
                                           " ON e.id = d.event_id WHERE e.type LIKE"
                                           " 'engine.%%' AND d.destination_id = %s",
                                     failing_sub) == 0, 60,
                       "the failing subscriber's deliveries to finish")
        payloads = received(fake, "sub", secret)

    (disabled,) = of_type(payloads, "engine.destination.disabled")
    assert disabled["destination_id"] == gone and "410" in disabled["reason"]
    assert dt.datetime.fromisoformat(disabled["time"]).tzinfo is not None
    opened = of_type(payloads, "engine.destination.breaker_opened")
    assert flapping in {p["destination_id"] for p in opened}
    assert failing_sub not in {p["destination_id"] for p in opened}
    assert all("consecutive failed attempts" in p["reason"] for p in opened)
    (recovered,) = of_type(payloads, "engine.destination.recovered")
    assert recovered["destination_id"] == flapping
    (dead,) = of_type(payloads, "engine.delivery.dead")
    assert dead["destination_id"] == dying and dead["event_type"] == "test.event"
    assert dead["reason"] == "HTTP 500" and dead["attempts"] == 2
    assert all(p.get("destination_id") != subscriber for p in payloads)

    # In the database: no operational event went to the destination it is about, and none
    # is about a delivery of an operational event, though the failing subscriber's died.
    assert count(conn, "SELECT count(*) FROM finished_deliveries f JOIN events e"
                       " ON e.id = f.event_id WHERE e.type LIKE 'engine.%%'"
                       " AND f.destination_id = %s AND f.status = 'dead'", failing_sub) > 0
    assert count(conn, "SELECT count(*) FROM events WHERE type = 'engine.delivery.dead'"
                       " AND payload::jsonb ->> 'event_type' LIKE 'engine.%%'") == 0
    assert count(conn, "SELECT count(*) FROM (SELECT event_id, destination_id FROM"
                       " deliveries UNION ALL SELECT event_id, destination_id FROM"
                       " finished_deliveries) d JOIN events e ON e.id = d.event_id"
                       " WHERE e.type LIKE 'engine.%%'"
                       " AND (e.payload::jsonb ->> 'destination_id')::bigint"
                       " = d.destination_id") == 0


def test_auto_disable_after_disable_after_and_re_enabling_resets_the_clock(
    conn: psycopg.Connection, dsn: str, tmp_path: Path
) -> None:
    secret = generate_secret()
    with FakeDestination() as fake, IngressProcess(dsn) as api:
        add_destination(conn, url=fake.url("fast/sub"), secret=secret,
                        event_types=["engine.destination.disabled"])
        failing = add_destination(conn, url=fake.url("status/500/failing"),
                                  retry_schedule=[0.2] * 200)
        enqueue(conn, ['{"n": 1}'], [failing])
        settings = 'breaker_threshold = 1000\ndisable_after = "2s"\n'

        def state() -> tuple:
            row = conn.execute("SELECT disabled, disabled_reason, failing_since"
                               " FROM destinations WHERE id = %s", [failing]).fetchone()
            assert row is not None
            return row

        with engine_with(dsn, tmp_path, settings):
            wait_until(lambda: state()[0], 30, "auto-disabled")
            _, reason, failing_since = state()
            since = failing_since.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            assert reason == f"every attempt has failed since {since}"
            wait_until(lambda: fake.name_stats("sub").get("requests", 0) >= 1, 30, "event")
            (event,) = received(fake, "sub", secret)
            assert event["type"] == "engine.destination.disabled"
            assert event["destination_id"] == failing and event["reason"] == reason
            # Its delivery is kept, waiting.
            assert count(conn, "SELECT count(*) FROM deliveries WHERE destination_id = %s",
                         failing) == 1

            answer = api.request("PATCH", f"/v1/destinations/{failing}", {"disabled": False})
            assert answer.status == 200, answer
            assert answer.json()["failing_since"] is None
            re_enabled = dt.datetime.fromisoformat(answer.json()["updated_at"])
            wait_until(lambda: state()[0], 30, "auto-disabled again")
            _, _, second_since = state()
            # The clock restarted: it counts from a failure after the re-enable.
            assert second_since >= re_enabled

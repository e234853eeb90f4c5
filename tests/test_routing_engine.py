"""Routing end to end (SPEC "Routing"): `engine` with its own ingress and workers, fake
destinations with filters and channels, and events that reach exactly the destinations
whose filter, channels and event types admit them, counted where they arrive."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from engine.testing.fakedest import FakeDestination
from engine.testing.ingress_server import IngressProcess
from engine.webhooks.signing import generate_secret
from tests.kit.enginerun import Engine, wait_until

# name -> (filter, channels, event types) of each destination.
ROUTES: dict[str, tuple[dict | None, list[str] | None, list[str] | None]] = {
    "all": (None, None, None),
    "gold": ({"customer.tier": {"$eq": "gold"}}, None, None),
    "big": ({"items.0.qty": {"$gt": 1}, "currency": {"$in": ["EUR", "USD"]}}, None, None),
    "eu": (None, ["eu"], None),
    "eu-gold": ({"$or": [{"customer.tier": {"$eq": "gold"}},
                         {"customer.vip": {"$exists": True}}]}, ["eu"], ["order.created"]),
    "not-test": ({"$not": {"test": {"$eq": True}}}, None, ["order.created"]),
}
# (payload, channels, type) -> the destinations it must reach.
EVENTS: list[tuple[dict, list[str] | None, str, set[str]]] = [
    ({"customer": {"tier": "gold"}, "items": [{"qty": 2}], "currency": "EUR"}, None,
     "order.created", {"all", "gold", "big", "eu", "eu-gold", "not-test"}),
    ({"customer": {"tier": "silver"}, "items": [{"qty": 1}], "test": True}, None,
     "order.created", {"all", "eu"}),
    ({"customer": {"tier": "gold"}, "items": [{"qty": "2"}], "currency": "EUR"}, ["eu"],
     "order.created", {"eu", "eu-gold"}),
    ({"customer": {"vip": None}, "items": [{"qty": 5}], "currency": "USD"}, ["us"],
     "order.created", set()),
    ({"customer": {"vip": 1}, "items": [{"qty": 5}], "currency": "USD"}, ["eu", "us"],
     "order.refunded", {"eu"}),
    ({"customer": {"tier": "gold"}, "items": [], "currency": "GBP"}, None, "order.refunded",
     {"all", "gold", "eu"}),
]


def _healthy(client: IngressProcess) -> bool:
    try:
        return client.request("GET", "/healthz", timeout=2).status == 200
    except OSError:
        return False


def test_events_reach_exactly_the_matching_destinations(
    dsn: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    secret = generate_secret()
    with FakeDestination(secrets=[secret]) as fake, Engine(
        dsn, tmp_path, "--procs", "1", "--bind", "127.0.0.1:0", "--allow-private-targets",
    ) as engine:
        [started] = wait_until(lambda: engine.events("supervisor_started"), 30, "supervisor")
        client = IngressProcess(dsn)  # only its HTTP client: the engine serves
        client.port = int(started["bind"].rsplit(":", 1)[1])
        wait_until(lambda: _healthy(client), 30, "ingress to answer")
        for name, (filter_, channels, types) in ROUTES.items():
            created = client.request("POST", "/v1/destinations", {
                "url": fake.url(f"fast/{name}"), "secret": secret, "filter": filter_,
                "channels": channels, "event_types": types})
            assert created.status == 201, created
        expected: dict[str, int] = dict.fromkeys(ROUTES, 0)
        for payload, channels, type_, reaches in EVENTS:
            body: dict = {"type": type_, "payload": payload}
            if channels is not None:
                body["channels"] = channels
            accepted = client.request("POST", "/v1/events", body)
            assert accepted.status == 202, accepted
            assert accepted.json()["deliveries"] == len(reaches), (payload, channels)
            for name in reaches:
                expected[name] += 1
        for name, count in expected.items():
            if count:
                fake.wait_for(name, "delivered_ids", count, timeout=30)
        time.sleep(0.5)  # anything sent that should not have been has arrived by now
        arrived = {name: fake.name_stats(name).get("delivered_ids", 0) for name in ROUTES}
        assert arrived == expected
        assert all(fake.name_stats(n).get("sig_bad", 0) == 0 for n in ROUTES)

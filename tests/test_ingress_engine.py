"""Ingress inside `engine`: the supervisor's listening socket shared by two ingress
children, events accepted over HTTP and delivered by the workers, signed, byte for byte."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg

from engine.testing.fakedest import FakeDestination
from engine.testing.ingress_server import IngressProcess
from engine.webhooks.signing import generate_secret
from tests.kit.enginerun import Engine, wait_until


def test_engine_accepts_over_http_and_delivers(
    dsn: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    secret = generate_secret()
    with FakeDestination(secrets=[secret]) as fake, Engine(
        dsn, tmp_path, "--procs", "1", "--ingress-procs", "2", "--bind", "127.0.0.1:0",
        "--allow-private-targets",
    ) as engine:
        [started] = wait_until(lambda: engine.events("supervisor_started"), 30, "supervisor")
        client = IngressProcess(dsn)  # only its HTTP client: the engine serves
        client.port = int(started["bind"].rsplit(":", 1)[1])
        wait_until(lambda: len(engine.events("child_started")) >= 4, 30, "children")
        wait_until(lambda: _healthy(client), 30, "ingress to answer")

        for name in ("a", "b"):
            created = client.request(
                "POST", "/v1/destinations", {"url": fake.url(f"fast/{name}"), "secret": secret}
            )
            assert created.status == 201, created
        payload = b'{"b" :  1, "a":"caf\\u00e9",\n "n": 1.50}'
        raw = b'{"type": "t", "payload": ' + payload + b"}"
        accepted = [client.request("POST", "/v1/events", raw=raw) for _ in range(20)]
        assert {a.status for a in accepted} == {202}
        assert {a.json()["deliveries"] for a in accepted} == {2}
        batch = client.request(
            "POST", "/v1/events/batch", {"events": [{"type": "t", "payload": i} for i in range(30)]}
        )
        assert batch.status == 202, batch

        for name in ("a", "b"):
            stats = fake.wait_for(name, "delivered_ids", 50, timeout=30)
            assert stats["sig_bad"] == 0
            assert stats["duplicates"] == 0
        bodies = {r["body"] for r in fake.requests("a")}
        assert payload in bodies

        metrics = client.request("GET", "/metrics").body.decode()
        assert "engine_ingress_requests_total" in metrics
        assert "engine_ingested_events_total 50.0" in metrics  # summed over both children

        engine.signal(signal.SIGTERM)
        assert engine.wait(40) == 0
        ingress_exits = [e for e in engine.events("child_exited") if e["role"] == "ingress"]
        assert [e.get("exit_code") for e in ingress_exits] == [0, 0], ingress_exits


def _healthy(client: IngressProcess) -> bool:
    try:
        return client.request("GET", "/healthz", timeout=2).status == 200
    except OSError:
        return False

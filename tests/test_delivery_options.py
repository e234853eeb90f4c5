"""Per-destination headers and retry schedules, end to end: a real engine (supervisor and
worker processes) POSTing over loopback to the fake destination, destinations made through
the API of a real ingress process, signatures checked by `standardwebhooks`."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import psycopg
from standardwebhooks import Webhook

from engine.db import queue
from engine.testing.fakedest import FakeDestination
from engine.testing.ingress_server import IngressProcess
from engine.webhooks.signing import generate_secret
from tests.kit import queue_sync
from tests.kit.data import count, enqueue, finished
from tests.kit.enginerun import wait_until
from tests.kit.workers import engine


def create(api: IngressProcess, **fields: object) -> dict:
    answer = api.request("POST", "/v1/destinations", fields)
    assert answer.status == 201, answer
    return answer.json()


def test_static_headers_go_on_every_request_and_leave_the_signature_alone(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    secret = generate_secret()
    extra = {"X-Api-Key": "k-123", "Authorization": "Bearer receiver-token",
             "X-Tenant": "acme\tcorp"}
    with FakeDestination(secrets=[secret]) as fake, IngressProcess(dsn) as api:
        # Flaky: about half the attempts fail, so retries must carry the headers too. Each
        # delivery has ten attempts: one in fifty runs one of the twenty fails all of them
        # and is dead, which is the schedule working, so every finished one counts.
        flaky = create(api, url=fake.url("flaky/50/headers"), secret=secret, headers=extra)
        enqueue(conn, [f'{{"n": {i}}}' for i in range(20)], [flaky["id"]])
        with engine(dsn, tmp_path, config, "--procs", "1"):
            wait_until(lambda: finished(conn, flaky["id"]) + finished(conn, flaky["id"], "dead")
                       == 20, 60, "20 delivered or dead")
        requests = fake.requests("headers")
        assert len(requests) > 20  # retries happened
        verifier = Webhook(secret)
        for request in requests:
            headers = request["headers"]
            verifier.verify(request["body"], headers)
            assert headers["x-api-key"] == "k-123"
            assert headers["authorization"] == "Bearer receiver-token"
            assert headers["x-tenant"] == "acme\tcorp"
            assert headers["content-type"] == "application/json"
            assert headers["user-agent"].startswith("engine/")
            assert len(headers["webhook-signature"].split(" ")) == 1
        assert fake.name_stats("headers")["sig_bad"] == 0


def attempts(conn: psycopg.Connection, delivery_id: int) -> int:
    return count(conn, "SELECT count(*) FROM delivery_attempts WHERE delivery_id = %s",
                 delivery_id)


def test_a_destination_schedule_replaces_the_global_one_from_the_next_failure(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    with FakeDestination() as fake, IngressProcess(dsn) as api:
        fake.control("sched", "fail", 500)
        # The engine's schedule (tests/test_worker.py) is ten attempts 200 ms apart; this
        # destination waits an hour after its first failure.
        dest = create(api, url=fake.url("toggle/sched"), retry_schedule=["1h", "1h"])
        enqueue(conn, ['{"n": 1}'], [dest["id"]])
        (delivery_id,) = [row[0] for row in conn.execute(
            "SELECT id FROM deliveries WHERE destination_id = %s", [dest["id"]])]
        with engine(dsn, tmp_path, config, "--procs", "1"):
            wait_until(lambda: attempts(conn, delivery_id) == 1, 30, "the first attempt")
            row = conn.execute(
                "SELECT next_attempt_at - now(), attempt, status::text FROM deliveries"
                " WHERE id = %s", [delivery_id]).fetchone()
            assert row is not None
            wait, attempt, status = row
            # One hour ± 20 % jitter, not the engine's 200 ms.
            assert dt.timedelta(minutes=47) < wait < dt.timedelta(minutes=73)
            assert (attempt, status) == (1, "pending")

            # A shorter schedule: the pending delivery keeps its time, and the next failure
            # follows the new schedule, whose length also sets the last attempt (3).
            patched = api.request("PATCH", f"/v1/destinations/{dest['id']}",
                                  {"retry_schedule": ["100ms", "100ms"]})
            assert patched.status == 200 and patched.json()["retry_schedule"] == [
                "100ms", "100ms"]
            conn.execute("UPDATE deliveries SET next_attempt_at = now() WHERE id = %s",
                         [delivery_id])
            wait_until(lambda: finished(conn, dest["id"], "dead") == 1, 30, "dead")
        assert attempts(conn, delivery_id) == 3
        assert fake.name_stats("sched")["requests"] == 3


def test_a_lost_attempt_counts_against_the_destination_schedule(
    conn: psycopg.Connection, dsn: str
) -> None:
    """A claim whose worker died is returned by return_claims.sql, which also reads the
    destination's last attempt (two attempts here, not the engine's ten)."""
    with IngressProcess(dsn) as api:
        dest = create(api, url="http://127.0.0.1:9/", retry_schedule=["100ms"])
    enqueue(conn, ['{"n": 1}'], [dest["id"]])
    for _ in range(2):
        assert len(queue_sync.claim_batch(conn, "lost-host:1", 10, 60_000)) == 1
        queue.release_claims(conn, "lost-host:1", max_attempts=10)
    assert finished(conn, dest["id"], "dead") == 1

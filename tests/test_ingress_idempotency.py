"""Idempotency-Key under concurrency and across a crash: one event, whatever happens."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from engine.ingress.committer import PAUSE_AFTER_COMMIT_ENV
from engine.testing.ingress_server import Answer, IngressProcess

EVENT = {"type": "order.created", "payload": {"order": 42}}


def event_count(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM events").fetchone()
    assert row is not None
    return int(row[0])


def add_destination(server: IngressProcess) -> None:
    answer = server.request("POST", "/v1/destinations", {"url": "http://127.0.0.1:9/x"})
    assert answer.status == 201


def test_concurrent_duplicates_on_two_processes_make_one_event(
    dsn: str, conn: psycopg.Connection
) -> None:
    with IngressProcess(dsn) as first, IngressProcess(dsn) as second:
        add_destination(first)
        add_destination(first)
        servers = [first, second]
        barrier = threading.Barrier(20)

        def send(index: int) -> Answer:
            barrier.wait()
            return servers[index % 2].request(
                "POST", "/v1/events", EVENT, headers={"Idempotency-Key": "same-key"}
            )

        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(send, range(20)))
    assert [a.status for a in answers] == [202] * 20, answers
    assert len({a.body for a in answers}) == 1
    assert answers[0].json()["deliveries"] == 2
    assert event_count(conn) == 1
    row = conn.execute("SELECT count(*) FROM deliveries").fetchone()
    assert row == (2,)


def test_same_key_in_one_batch_resolves_to_one_event(
    dsn: str, conn: psycopg.Connection
) -> None:
    with IngressProcess(dsn) as server:
        add_destination(server)
        events = [{**EVENT, "idempotency_key": "k"}] * 3 + [{**EVENT, "idempotency_key": "j"}]
        answer = server.request("POST", "/v1/events/batch", {"events": events})
        assert answer.status == 202, answer
        ids = [item["id"] for item in answer.json()["data"]]
        assert ids[0] == ids[1] == ids[2] != ids[3]
    assert event_count(conn) == 2


def test_crash_between_commit_and_answer_then_retry_gives_one_event(
    dsn: str, conn: psycopg.Connection
) -> None:
    headers = {"Idempotency-Key": "crash-key"}
    with IngressProcess(dsn, env={PAUSE_AFTER_COMMIT_ENV: "30"}) as doomed:
        add_destination(doomed)
        outcome: list[BaseException | Answer] = []

        def send() -> None:
            try:
                outcome.append(doomed.request("POST", "/v1/events", EVENT, headers=headers))
            except OSError as exc:
                outcome.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 10
        while event_count(conn) == 0:
            assert time.monotonic() < deadline, "the event was never committed"
            time.sleep(0.02)
        assert not outcome  # committed, not yet answered
        doomed.kill()
        sender.join(10)
    assert len(outcome) == 1
    assert isinstance(outcome[0], OSError), outcome  # the client never got an answer

    with IngressProcess(dsn) as restarted:
        retry = restarted.request("POST", "/v1/events", EVENT, headers=headers)
        assert retry.status == 202, retry
        stored = conn.execute("SELECT id, delivery_count FROM events").fetchall()
        assert stored == [(retry.json()["id"], retry.json()["deliveries"])]
        different = restarted.request(
            "POST", "/v1/events", {**EVENT, "payload": 1}, headers=headers
        )
        assert different.status == 409
    assert event_count(conn) == 1


@pytest.mark.parametrize("key", ["", "x" * 257], ids=["empty", "too-long"])
def test_bad_idempotency_keys_are_refused(dsn: str, conn: psycopg.Connection, key: str) -> None:
    with IngressProcess(dsn) as server:
        answer = server.request("POST", "/v1/events", EVENT, headers={"Idempotency-Key": key})
    assert answer.status == 422
    assert event_count(conn) == 0


def test_batch_whose_answer_is_lost_is_retried_into_each_event_once(
    dsn: str, conn: psycopg.Connection
) -> None:
    """Ingress killed (SIGKILL) after the batch's commit, before its answer: the client
    retries the same batch with the same per-event keys and gets each event once, with the
    ids of the first commit; a key it adds on the retry is a new event."""
    events = [{**EVENT, "payload": n, "idempotency_key": f"batch-{n}"} for n in range(5)]
    with IngressProcess(dsn, env={PAUSE_AFTER_COMMIT_ENV: "30"}) as doomed:
        add_destination(doomed)
        outcome: list[BaseException | Answer] = []

        def send() -> None:
            try:
                outcome.append(doomed.request("POST", "/v1/events/batch", {"events": events}))
            except OSError as exc:
                outcome.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 10
        while event_count(conn) < len(events):
            assert time.monotonic() < deadline, "the batch was never committed"
            time.sleep(0.02)
        assert not outcome  # committed, not yet answered
        doomed.kill()
        sender.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], OSError), outcome
    first_ids = [row[0] for row in conn.execute("SELECT id FROM events ORDER BY id")]

    with IngressProcess(dsn) as restarted:
        retry = restarted.request("POST", "/v1/events/batch", {"events": events})
        assert retry.status == 202, retry
        assert [item["id"] for item in retry.json()["data"]] == first_ids
        extra = {**EVENT, "payload": 99, "idempotency_key": "batch-new"}
        grown = restarted.request("POST", "/v1/events/batch", {"events": [*events, extra]})
        assert grown.status == 202, grown
        assert [item["id"] for item in grown.json()["data"]][:5] == first_ids
    assert event_count(conn) == len(events) + 1
    row = conn.execute("SELECT count(*) FROM deliveries").fetchone()
    assert row == (len(events) + 1,)

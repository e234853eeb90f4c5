"""Example tests of the queue operations against a real PostgreSQL."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest
from psycopg.types.json import Jsonb

from engine.db import queue
from engine.db.queue import EventIn, Result
from engine.maintenance.reaper import reap_expired
from tests.kit import queue_sync
from tests.kit.data import LEASE_MS, add_destination, now, statuses

pytestmark = pytest.mark.pg_versions


def test_enqueue_fans_out_by_event_type(conn: psycopg.Connection) -> None:
    all_types = add_destination(conn)
    orders_only = add_destination(conn, event_types=["order.created"])
    add_destination(conn, event_types=["user.deleted"])
    add_destination(conn, disabled=True)
    with conn.transaction():
        answers = queue_sync.enqueue_events(
            conn, [EventIn("order.created", '{"a": 1}'), EventIn("x", "[]", [orders_only])]
        )
    assert [count for _, count in answers] == [2, 1]
    rows = conn.execute(
        "SELECT event_id, destination_id FROM deliveries ORDER BY event_id, destination_id"
    ).fetchall()
    first, second = answers[0][0], answers[1][0]
    assert rows == [(first, all_types), (first, orders_only), (second, orders_only)]


def test_enqueue_refers_only_to_live_destinations(conn: psycopg.Connection) -> None:
    """No foreign key checks destination_id (schema/005): the enqueue itself writes
    deliveries only for destinations that exist and are not deleted. (The API refuses such
    ids with 422 before it enqueues; this is what a race with a delete gets.)"""
    live = add_destination(conn)
    deleted = add_destination(conn, deleted_at=now(conn))
    with conn.transaction():
        answers = queue_sync.enqueue_events(conn, [
            EventIn("t", "{}", [live, deleted, 999_999]), EventIn("t", "{}", [deleted]),
            EventIn("t", "{}"),
        ])
    assert [count for _, count in answers] == [1, 0, 1]
    rows = conn.execute(
        "SELECT event_id, destination_id FROM deliveries ORDER BY event_id"
    ).fetchall()
    assert rows == [(answers[0][0], live), (answers[2][0], live)]


def test_idempotency_key_writes_once(conn: psycopg.Connection) -> None:
    add_destination(conn)
    event = EventIn("t", "{}", idempotency_key="k1", request_hash=b"h")
    with conn.transaction():
        first = queue_sync.enqueue_events(conn, [event, event])
    with conn.transaction():
        again = queue_sync.enqueue_events(conn, [event])
    assert first[0][0] is not None and first[1][0] is None and again[0][0] is None
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone() == (1,)


def test_claim_returns_everything_needed_and_marks_in_flight(conn: psycopg.Connection) -> None:
    dest = add_destination(conn, timeout_ms=1234)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", '{"x": "é"}')])
    claims = queue_sync.claim_batch(conn, "w1", 10, LEASE_MS)
    assert len(claims) == 1
    claim = claims[0]
    assert claim.destination_id == dest and claim.attempt == 1 and claim.timeout_ms == 1234
    assert claim.payload == '{"x": "é"}' and claim.secrets[0].startswith("whsec_")
    row = conn.execute(
        "SELECT status::text, locked_by, locked_until > now() + interval '59 s' FROM deliveries"
    ).fetchone()
    assert row == ("in_flight", "w1", True)
    assert queue_sync.claim_batch(conn, "w2", 10, LEASE_MS) == []


def test_every_claim_carries_its_destinations_settings(conn: psycopg.Connection) -> None:
    """The claim sends a destination's columns on its first row only (claim_batch.sql,
    refill_slots.sql); every Claim, of a claim and of a slot refill, still has all of
    its own destination's, none of another's."""
    plain = add_destination(conn, timeout_ms=1111, headers=Jsonb({"X-A": "a"}),
                            retry_schedule=[1.0, 2.0], propagate_trace=True)
    rotated = add_destination(conn, timeout_ms=2222, previous_secret="whsec_b2xkb2xkb2xkb2xk",
                              previous_secret_until=now(conn) + dt.timedelta(hours=1))
    capped = add_destination(conn, timeout_ms=3333, max_in_flight=2)
    settings = {dest: conn.execute(
        "SELECT url, timeout_ms, headers, retry_schedule, max_in_flight, propagate_trace,"
        " tenant_id, secret, previous_secret FROM destinations WHERE id = %s", (dest,)
    ).fetchone() for dest in (plain, rotated, capped)}
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", f'{{"n": {n}}}') for n in range(5)])

    def check(claims: list[queue.Claim]) -> None:
        for claim in claims:
            url, timeout_ms, headers, schedule, cap, propagate, tenant, secret, previous = (
                settings[claim.destination_id])
            assert (claim.url, claim.timeout_ms, claim.headers, claim.retry_schedule,
                    claim.max_in_flight, claim.propagate_trace, claim.tenant_id) == (
                url, timeout_ms, headers, schedule, cap, propagate, tenant)
            assert claim.secrets == ([secret, previous] if previous else [secret])

    claims = queue_sync.claim_batch(conn, "w1", 20, LEASE_MS)
    assert sorted(c.destination_id for c in claims).count(plain) == 5
    assert sorted(c.destination_id for c in claims).count(capped) == 2
    check(claims)
    t = now(conn)
    done = [queue.Result(c.id, c.attempt, "delivered", t, 1, 200, claim_token=c.claim_token)
            for c in claims if c.destination_id == capped]
    refilled = queue_sync.record_results_and_refill(conn, "w1", done, LEASE_MS, {capped: 2},
                                                    spares={capped: 1})
    assert [c.destination_id for c in refilled] == [capped] * 3
    check(refilled)


def test_record_results_delivered_retry_dead(conn: psycopg.Connection) -> None:
    add_destination(conn)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}") for _ in range(3)])
    claims = queue_sync.claim_batch(conn, "w1", 10, LEASE_MS)
    t = now(conn)
    later = t + dt.timedelta(hours=1)
    results = [
        Result(claims[0].id, 1, "delivered", t, 5, 200),
        Result(claims[1].id, 1, "retry", t, 5, 500, "HTTP 500", "oops", later),
        Result(claims[2].id, 1, "dead", t, 5, 500, "HTTP 500"),
    ]
    assert queue_sync.record_results(conn, "w1", results) == 3
    assert statuses(conn) == {
        claims[0].id: "delivered", claims[1].id: "pending", claims[2].id: "dead"
    }
    assert conn.execute("SELECT count(*) FROM delivery_attempts").fetchone() == (3,)
    assert conn.execute(
        "SELECT next_attempt_at, last_error FROM deliveries WHERE id = %s", (claims[1].id,)
    ).fetchone() == (later, "HTTP 500")
    # Not due yet: nothing to claim.
    assert queue_sync.claim_batch(conn, "w1", 10, LEASE_MS) == []


def test_result_from_a_worker_that_lost_the_claim_changes_nothing(
    conn: psycopg.Connection,
) -> None:
    add_destination(conn)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}")])
    (claim,) = queue_sync.claim_batch(conn, "w1", 10, LEASE_MS)
    assert queue.release_claims(conn, "w1", max_attempts=10) == 1
    (again,) = queue_sync.claim_batch(conn, "w2", 10, LEASE_MS)
    assert again.attempt == 2
    late = Result(claim.id, claim.attempt, "delivered", now(conn), 1, 200)
    assert queue_sync.record_results(conn, "w1", [late]) == 0
    assert statuses(conn) == {claim.id: "in_flight"}
    # One attempt row for the lost attempt, none for the late result.
    assert conn.execute("SELECT count(*) FROM delivery_attempts").fetchone() == (1,)


def test_reap_returns_only_expired_claims(conn: psycopg.Connection) -> None:
    add_destination(conn)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}") for _ in range(2)])
    short = queue_sync.claim_batch(conn, "w1", 1, lease_ms=1)
    long = queue_sync.claim_batch(conn, "w2", 1, LEASE_MS)
    conn.execute("SELECT pg_sleep(0.01)")
    assert reap_expired(conn, max_attempts=10) == 1
    assert statuses(conn) == {short[0].id: "pending", long[0].id: "in_flight"}


def test_paused_and_disabled_destinations_are_skipped(conn: psycopg.Connection) -> None:
    paused = add_destination(conn, paused=True)
    disabled = add_destination(conn, disabled=True)
    healthy = add_destination(conn)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [paused, disabled, healthy])])
    claims = queue_sync.claim_batch(conn, "w1", 10, LEASE_MS)
    assert [c.destination_id for c in claims] == [healthy]
    conn.execute("UPDATE destinations SET paused = false, disabled = false")
    assert {c.destination_id for c in queue_sync.claim_batch(conn, "w1", 10, LEASE_MS)} == {
        paused, disabled
    }


def test_ordered_destination_releases_one_at_a_time(conn: psycopg.Connection) -> None:
    dest = add_destination(conn, ordered=True)
    with conn.transaction():
        queue_sync.enqueue_events(
            conn,
            [EventIn("t", str(i), [dest], ordering_key=k) for i, k in enumerate("aab")],
        )
    first = queue_sync.claim_batch(conn, "w1", 10, LEASE_MS)
    assert sorted(c.payload for c in first) == ["0", "2"]
    assert queue_sync.claim_batch(conn, "w1", 10, LEASE_MS) == []
    a0 = next(c for c in first if c.payload == "0")
    t = now(conn)
    queue_sync.record_results(conn, "w1", [Result(a0.id, 1, "retry", t, 1, 500, "e", None, t)])
    # A failed head stays at the head: the next one of key 'a' waits behind it.
    assert [c.payload for c in queue_sync.claim_batch(conn, "w1", 10, LEASE_MS)] == ["0"]


def test_breaker_opens_after_threshold_and_probe_closes(conn: psycopg.Connection) -> None:
    dest = add_destination(conn)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}") for _ in range(8)])
    settings = queue.BreakerSettings(threshold=5, base_pause_ms=1, max_pause_ms=10)
    claims = queue_sync.claim_batch(conn, "w1", 5, LEASE_MS)
    t = now(conn)
    failures = [Result(c.id, 1, "retry", t, 1, 500, "e", None, t) for c in claims]
    queue_sync.record_results(conn, "w1", failures, settings)
    assert conn.execute(
        "SELECT breaker::text, consecutive_failures FROM destinations"
    ).fetchone() == ("open", 5)
    conn.execute("SELECT pg_sleep(0.01)")
    probe = queue_sync.claim_batch(conn, "w1", 10, LEASE_MS)
    assert len(probe) == 1 and probe[0].destination_id == dest
    assert conn.execute("SELECT breaker::text FROM destinations").fetchone() == ("half_open",)
    assert queue_sync.claim_batch(conn, "w2", 10, LEASE_MS) == []
    ok = Result(probe[0].id, probe[0].attempt, "delivered", now(conn), 1, 200)
    queue_sync.record_results(conn, "w1", [ok], settings)
    assert conn.execute(
        "SELECT breaker::text, consecutive_failures, paused_until FROM destinations"
    ).fetchone() == ("closed", 0, None)
    assert len(queue_sync.claim_batch(conn, "w1", 10, LEASE_MS)) == 7


def test_replay_dead_moves_back_as_first_attempts(conn: psycopg.Connection) -> None:
    dest = add_destination(conn)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}") for _ in range(7)])
    claims = queue_sync.claim_batch(conn, "w1", 10, LEASE_MS)
    t = now(conn)
    dead = [Result(c.id, 1, "dead", t, 1, 500, "e") for c in claims]
    queue_sync.record_results(conn, "w1", dead, queue.BreakerSettings(threshold=100))
    assert queue_sync.replay_dead(conn, dest, batch=3) == 7
    assert set(statuses(conn).values()) == {"pending"}
    again = queue_sync.claim_batch(conn, "w1", 10, LEASE_MS)
    assert {c.attempt for c in again} == {1}


@pytest.mark.parametrize("outcome", ["bogus"])
def test_unknown_outcome_is_refused(conn: psycopg.Connection, outcome: str) -> None:
    with pytest.raises(ValueError):
        queue_sync.record_results(conn, "w", [Result(1, 1, outcome, now(conn))])

"""Operational events cannot loop: whatever the destinations answer, subscribers that fail
included, driving the real claim and record statements until nothing is left to send
always ends, and the invariants hold (hypothesis, against a real PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.db.queue import BreakerSettings, Result
from engine.observe.operational_events import EVENT_TYPES
from tests.kit import queue_sync
from tests.kit.data import add_destination, count, enqueue
from tests.kit.dbserver import truncate_all

pytestmark = pytest.mark.pg_versions

BREAKER = BreakerSettings(threshold=2, base_pause_ms=1, max_pause_ms=2)
MAX_ATTEMPTS = 3
# Claims that found work. A loop would never end; a run that settles needs about one claim
# per attempt of a paused destination (its breaker lets one probe through at a time).
MAX_ROUNDS = 3000
Behaviour = st.sampled_from(["ok", "fail", "odd_attempts_fail"])


@pytest.fixture(scope="module")
def db(module_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        yield conn


def answer(behaviour: str, attempt: int) -> str:
    fails = behaviour == "fail" or (behaviour == "odd_attempts_fail" and attempt % 2 == 1)
    if not fails:
        return "delivered"
    return "dead" if attempt >= MAX_ATTEMPTS else "retry"


def remaining(conn: psycopg.Connection) -> int:
    return count(conn, "SELECT count(*) FROM deliveries")


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sources=st.lists(Behaviour, min_size=1, max_size=3),
       subscribers=st.lists(Behaviour, min_size=1, max_size=3),
       events=st.integers(min_value=1, max_value=4))
def test_operational_events_always_settle(
    db: psycopg.Connection, sources: list[str], subscribers: list[str], events: int
) -> None:
    truncate_all(db)
    behaviour: dict[int, str] = {}
    schedule = [0.001] * (MAX_ATTEMPTS - 1)
    for kind in sources:
        dest = add_destination(db, retry_schedule=schedule)
        behaviour[dest] = kind
        enqueue(db, [f'{{"n": {i}}}' for i in range(events)], [dest])
    for kind in subscribers:
        dest = add_destination(db, retry_schedule=schedule, event_types=list(EVENT_TYPES))
        behaviour[dest] = kind

    rounds = 0
    while remaining(db):
        assert rounds < MAX_ROUNDS, db.execute(
            "SELECT type, count(*) FROM events GROUP BY type").fetchall()
        claims = queue_sync.claim_batch(db, "prop:1", 100, 60_000)
        if not claims:
            time.sleep(0.003)  # a breaker pause (1-2 ms) running out
            continue
        rounds += 1
        now = dt.datetime.now(dt.UTC)
        results = []
        for claim in claims:
            outcome = answer(behaviour[claim.destination_id], claim.attempt)
            results.append(Result(claim.id, claim.attempt, outcome, now,
                                  error=None if outcome == "delivered" else "HTTP 500",
                                  next_attempt_at=now if outcome == "retry" else None))
        queue_sync.record_results(db, "prop:1", results, BREAKER)

    # Never to the destination it is about.
    assert count(db, "SELECT count(*) FROM finished_deliveries d JOIN events e"
                     " ON e.id = d.event_id WHERE e.type LIKE 'engine.%%'"
                     " AND (e.payload::jsonb ->> 'destination_id')::bigint"
                     " = d.destination_id") == 0
    # Never about a delivery of an operational event.
    assert count(db, "SELECT count(*) FROM events WHERE type = 'engine.delivery.dead'"
                     " AND payload::jsonb ->> 'event_type' LIKE 'engine.%%'") == 0
    # One engine.delivery.dead per dead application delivery, and only with a subscriber.
    dead_app = count(db, "SELECT count(*) FROM finished_deliveries d JOIN events e"
                         " ON e.id = d.event_id WHERE d.status = 'dead'"
                         " AND e.type NOT LIKE 'engine.%%'")
    assert count(db, "SELECT count(*) FROM events WHERE type = 'engine.delivery.dead'"
                 ) == dead_app
    # Every operational event has a delivery per subscriber other than its subject.
    assert count(db, "SELECT count(*) FROM events e WHERE e.type LIKE 'engine.%%'"
                     " AND e.delivery_count <> (SELECT count(*) FROM finished_deliveries f"
                     " WHERE f.event_id = e.id)") == 0

"""The claim token: a result changes a delivery only if it belongs to the claim that is
current. Hypothesis drives claims by two workers, reaping, releases (a worker's own and
the supervisor's for a dead worker) and results of any earlier claim arriving late."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.db import queue
from engine.db.queue import BreakerSettings, Claim, EventIn, Result
from engine.maintenance.reaper import reap_expired
from tests.kit import queue_sync
from tests.kit.data import add_destination

pytestmark = pytest.mark.pg_versions

LEASE_MS = 60_000
MAX_ATTEMPTS = 1000  # never dead by attempts here: the guard is what is under test
WORKERS = ("host:1", "host:2")
NO_BREAKER = BreakerSettings(threshold=1 << 30)  # failures must not pause the destination

step = st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(WORKERS)),
    st.tuples(st.just("reap")),
    st.tuples(st.just("worker_exited"), st.sampled_from(WORKERS)),
    # a result of the n-th claim so far (counted from the newest), whenever it arrives
    st.tuples(st.just("result"), st.integers(0, 5),
              st.sampled_from(["delivered", "retry", "released", "dead"])),
)


@pytest.fixture(scope="module")
def token_conn(module_dsn: str) -> Iterator[tuple[psycopg.Connection, int]]:
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        yield conn, add_destination(conn)


def row(conn: psycopg.Connection, delivery_id: int) -> tuple | None:
    return conn.execute(
        "SELECT status::text, attempt, locked_by, claim_token, last_error FROM deliveries"
        " WHERE id = %s UNION ALL SELECT status::text, attempt, NULL, NULL, last_error"
        " FROM finished_deliveries WHERE id = %s", [delivery_id, delivery_id]).fetchone()


def result_of(claim: Claim, outcome: str, worker_note: str) -> Result:
    at = dt.datetime.now(dt.UTC)
    return Result(claim.id, claim.attempt, outcome, at, 5, 200 if outcome == "delivered"
                  else 500, None if outcome == "delivered" else worker_note, None,
                  at if outcome == "retry" else None, claim.claim_token)


@st.composite
def race_then_anything(draw: st.DrawFn) -> list[tuple]:
    """The late-result race (a claim, its end by reaping or a release, a re-claim by
    either worker, the first claim's result arriving late, the current claim's result),
    then any steps at all."""
    first, second = draw(st.sampled_from(WORKERS)), draw(st.sampled_from(WORKERS))
    ending = draw(st.sampled_from([("reap",), ("worker_exited", first),
                                   ("result", 0, "released")]))
    late, now = (draw(st.sampled_from(["delivered", "retry", "released", "dead"]))
                 for _ in range(2))
    race = [("claim", first), ending, ("claim", second), ("result", 1, late),
            ("result", 0, now)]
    return race + draw(st.lists(step, max_size=10))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=race_then_anything())
def test_a_result_applies_only_to_the_current_claim(
    token_conn: tuple[psycopg.Connection, int], steps: list[tuple]
) -> None:
    conn, destination = token_conn
    for table in ("deliveries", "finished_deliveries", "delivery_attempts", "events"):
        conn.execute(f"DELETE FROM {table}")
    [(event_id, _)] = queue_sync.enqueue_events(conn, [EventIn("t", "{}", [destination])])
    claims: list[tuple[str, Claim]] = []  # every claim made, oldest first, with its worker
    current: tuple[str, Claim] | None = None  # the claim the row is in flight under
    finished = False
    for n, (kind, *args) in enumerate(steps):
        if kind == "claim" and not finished:
            got = queue_sync.claim_batch(conn, args[0], 1, LEASE_MS)
            assert len(got) == (0 if current is not None else 1)
            if got:
                current = (args[0], got[0])
                claims.append(current)
        elif kind == "reap":
            conn.execute("UPDATE deliveries SET locked_until = now() - interval '1 second'"
                         " WHERE status = 'in_flight'")
            assert reap_expired(conn, MAX_ATTEMPTS) == (current is not None)
            current = None
        elif kind == "worker_exited":
            released = queue.release_claims(conn, args[0], MAX_ATTEMPTS)
            assert released == (current is not None and current[0] == args[0])
            if released:
                current = None
        elif kind == "result" and claims:
            worker, claim = claims[-1 - min(args[0], len(claims) - 1)]
            before = row(conn, claim.id)
            applied = queue_sync.record_results(
                conn, worker, [result_of(claim, args[1], f"s{n}")], NO_BREAKER)
            is_current = current is not None and current[1] is claim
            assert applied == is_current, (steps[: n + 1], before, row(conn, claim.id))
            if not is_current:
                assert row(conn, claim.id) == before  # a late result changes nothing
            else:
                current = None
                finished = args[1] in ("delivered", "dead")
    state = row(conn, claims[0][1].id if claims else 0)
    if current is not None:
        assert state is not None and state[0] == "in_flight"
        assert state[3] == current[1].claim_token
    assert conn.execute("SELECT count(*) FROM deliveries d JOIN finished_deliveries f"
                        " USING (id)").fetchone() == (0,)
    assert event_id is not None


def test_released_then_reclaimed_by_the_same_worker_ignores_the_old_result(
    conn: psycopg.Connection
) -> None:
    """The race the token closes, spelled out: the same worker and the same attempt
    number for two claims, which the (locked_by, attempt) guard could not tell apart."""
    destination = add_destination(conn)
    queue_sync.enqueue_events(conn, [EventIn("t", "{}", [destination])])
    [first] = queue_sync.claim_batch(conn, "host:1", 1, LEASE_MS)
    assert queue_sync.record_results(conn, "host:1", [result_of(first, "released", "")]) == 1
    [second] = queue_sync.claim_batch(conn, "host:1", 1, LEASE_MS)
    assert (second.id, second.attempt) == (first.id, first.attempt)
    assert second.claim_token != first.claim_token
    assert queue_sync.record_results(conn, "host:1", [result_of(first, "delivered", "")]) == 0
    assert row(conn, first.id)[:2] == ("in_flight", 1)  # type: ignore[index]
    assert queue_sync.record_results(conn, "host:1", [result_of(second, "delivered", "")]) == 1
    assert row(conn, first.id)[0] == "delivered"  # type: ignore[index]


def test_a_stalled_claim_transaction_commits_a_lease_from_claim_time(
    conn: psycopg.Connection
) -> None:
    """The lease runs from when the rows are claimed, not from BEGIN: a claimer stalled
    inside its transaction for longer than the lease still commits a lease in the future."""
    destination = add_destination(conn)
    queue_sync.enqueue_events(conn, [EventIn("t", "{}", [destination])])
    with conn.transaction():
        conn.execute("SELECT pg_sleep(1.2)")  # the stall, after BEGIN
        claimed = queue_sync.claim_batch(conn, "host:1", 1, 1000)
    assert len(claimed) == 1
    remaining = conn.execute("SELECT locked_until > now() FROM deliveries").fetchone()
    assert remaining == (True,)

"""The circuit breaker at the SQL level: claim_batch and record_results, no HTTP."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import partial

import psycopg
import pytest

from engine.db.queue import BreakerSettings, Claim, EventIn, Result
from tests.kit import queue_sync
from tests.kit.data import LEASE_MS, add_destination, now
from tests.kit.threads import run_threads

pytestmark = pytest.mark.pg_versions
BREAKER = BreakerSettings(threshold=3, base_pause_ms=1_000, max_pause_ms=3_000)


def enqueue(conn: psycopg.Connection, destination: int, count: int) -> None:
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [destination]) for _ in range(count)])


def record(conn: psycopg.Connection, claims: Sequence[Claim], outcome: str,
           worker: str = "w", status_code: int = 500) -> int:
    t = now(conn)
    results = [
        Result(c.id, c.attempt, outcome, t, 5, status_code, "boom", None,
               t if outcome in ("retry", "gone") else None)
        for c in claims
    ]
    return queue_sync.record_results(conn, worker, results, BREAKER)


def breaker(conn: psycopg.Connection, destination: int) -> tuple:
    row = conn.execute(
        "SELECT breaker::text, consecutive_failures, breaker_pause_ms,"
        " extract(epoch FROM paused_until - now())::float8, disabled"
        " FROM destinations WHERE id = %s", [destination],
    ).fetchone()
    assert row is not None
    return row


def one(conn: psycopg.Connection, query: str, *params: object) -> object:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def end_pause(conn: psycopg.Connection, destination: int) -> None:
    conn.execute("UPDATE destinations SET paused_until = now() - interval '1 second'"
                 " WHERE id = %s", [destination])


def claim_for(conn: psycopg.Connection, destination: int, limit: int = 100) -> list[Claim]:
    return [c for c in queue_sync.claim_batch(conn, "w", limit, LEASE_MS)
            if c.destination_id == destination]


def open_breaker(conn: psycopg.Connection, destination: int) -> None:
    claims = claim_for(conn, destination, BREAKER.threshold)
    assert len(claims) == BREAKER.threshold
    record(conn, claims, "retry")


def test_opens_after_threshold_and_claim_skips_it(conn: psycopg.Connection) -> None:
    dead = add_destination(conn)
    healthy = add_destination(conn)
    enqueue(conn, dead, 10)
    claims = claim_for(conn, dead, 2)
    record(conn, claims, "retry")
    assert breaker(conn, dead)[:2] == ("closed", 2)
    claims = claim_for(conn, dead, 1)
    record(conn, claims, "retry")
    state, failures, pause_ms, remaining, _ = breaker(conn, dead)
    assert (state, failures, pause_ms) == ("open", 3, 1_000)
    assert 0 < remaining <= 1.0
    assert one(conn, "SELECT now() - breaker_opened_at < interval '10 seconds'"
                     " FROM destinations WHERE id = %s", dead)
    enqueue(conn, healthy, 3)
    got = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    assert {c.destination_id for c in got} == {healthy} and len(got) == 3


def test_a_success_in_between_resets_the_count(conn: psycopg.Connection) -> None:
    dest = add_destination(conn)
    enqueue(conn, dest, 6)
    claims = claim_for(conn, dest, 6)
    t = now(conn)
    outcomes = ["retry", "retry", "delivered", "retry", "retry", "delivered"]
    queue_sync.record_results(conn, "w", [
        Result(c.id, c.attempt, o, t, 1, 500, "e", None, t if o == "retry" else None)
        for c, o in zip(claims, outcomes, strict=True)
    ], BREAKER)
    assert breaker(conn, dest)[:2] == ("closed", 0)


def test_exactly_one_probe_under_concurrent_claimers(dsn: str, conn: psycopg.Connection) -> None:
    dest = add_destination(conn)
    enqueue(conn, dest, 50)
    open_breaker(conn, dest)
    workers = 6
    for round_ in range(5):
        end_pause(conn, dest)
        # A timeout: a claimer that failed before the barrier must not leave the rest
        # waiting for it forever (run_threads re-raises its exception).
        barrier = threading.Barrier(workers, timeout=30)
        got: list[list[Claim]] = [[] for _ in range(workers)]

        def claimer(slot: int, barrier: threading.Barrier, got: list[list[Claim]]) -> None:
            with psycopg.connect(dsn, autocommit=True) as own:
                barrier.wait()
                got[slot] = queue_sync.claim_batch(own, f"w{slot}", 10, LEASE_MS)

        run_threads([partial(claimer, i, barrier, got) for i in range(workers)], 60)
        probes = [c for claims in got for c in claims]
        assert len(probes) == 1, f"round {round_}: {len(probes)} probes"
        assert breaker(conn, dest)[0] == "half_open"
        # While the probe is out, nobody gets more of this destination.
        assert queue_sync.claim_batch(conn, "other", 10, LEASE_MS) == []
        worker = next(f"w{i}" for i, claims in enumerate(got) if claims)
        record(conn, probes, "retry", worker)
        assert breaker(conn, dest)[0] == "open"


def test_probe_success_closes(conn: psycopg.Connection) -> None:
    dest = add_destination(conn)
    enqueue(conn, dest, 10)
    open_breaker(conn, dest)
    end_pause(conn, dest)
    probe = claim_for(conn, dest)
    assert len(probe) == 1
    record(conn, probe, "delivered")
    state, failures, pause_ms, remaining, _ = breaker(conn, dest)
    assert (state, failures, pause_ms, remaining) == ("closed", 0, 0, None)
    assert one(conn, "SELECT breaker_opened_at FROM destinations WHERE id = %s", dest) is None
    assert len(claim_for(conn, dest)) == 10 - 1  # all the rest, at once


def test_probe_failure_reopens_with_doubled_pause_capped(conn: psycopg.Connection) -> None:
    dest = add_destination(conn)
    enqueue(conn, dest, 10)
    open_breaker(conn, dest)
    opened_at = one(conn, "SELECT breaker_opened_at FROM destinations WHERE id = %s", dest)
    pauses = []
    for _ in range(3):
        end_pause(conn, dest)
        probe = claim_for(conn, dest)
        assert len(probe) == 1
        record(conn, probe, "retry")
        state, _, pause_ms, remaining, _ = breaker(conn, dest)
        assert state == "open" and 0 < remaining <= pause_ms / 1000
        pauses.append(pause_ms)
    assert pauses == [2_000, 3_000, 3_000]
    # Still the time it first opened: re-opening after a failed probe is the same outage.
    assert one(conn, "SELECT breaker_opened_at FROM destinations WHERE id = %s",
               dest) == opened_at


def test_late_failures_of_an_open_breaker_do_not_extend_its_pause(
    conn: psycopg.Connection,
) -> None:
    dest = add_destination(conn)
    enqueue(conn, dest, 10)
    claims = claim_for(conn, dest, 5)
    record(conn, claims[:3], "retry")
    before = conn.execute("SELECT paused_until FROM destinations WHERE id = %s",
                          [dest]).fetchone()
    record(conn, claims[3:], "retry")  # sent before it opened, answered after
    after = conn.execute("SELECT paused_until FROM destinations WHERE id = %s",
                         [dest]).fetchone()
    assert before == after and breaker(conn, dest)[:3] == ("open", 5, 1_000)


def test_gone_disables_and_keeps_deliveries(conn: psycopg.Connection) -> None:
    dest = add_destination(conn)
    enqueue(conn, dest, 4)
    claims = claim_for(conn, dest, 1)
    record(conn, claims, "gone", status_code=410)
    assert breaker(conn, dest)[4] is True
    assert conn.execute("SELECT count(*) FROM deliveries WHERE destination_id = %s"
                        " AND status = 'pending'", [dest]).fetchone() == (4,)
    assert claim_for(conn, dest) == []
    conn.execute("UPDATE destinations SET disabled = false WHERE id = %s", [dest])
    assert len(claim_for(conn, dest)) == 4


def test_pause_keeps_and_resume_delivers(conn: psycopg.Connection) -> None:
    dest = add_destination(conn)
    conn.execute("UPDATE destinations SET paused = true WHERE id = %s", [dest])
    enqueue(conn, dest, 5)
    assert claim_for(conn, dest) == []
    conn.execute("UPDATE destinations SET paused = false WHERE id = %s", [dest])
    claims = claim_for(conn, dest)
    assert len(claims) == 5
    record(conn, claims, "delivered")
    assert conn.execute("SELECT count(*) FROM finished_deliveries WHERE destination_id = %s"
                        " AND status = 'delivered'", [dest]).fetchone() == (5,)


def test_healthy_results_take_no_destination_lock(dsn: str, conn: psycopg.Connection) -> None:
    """Successes of a healthy destination must not wait for a transaction that holds its
    row (an operator PATCH, a breaker change): only breaker changes lock the row."""
    dest = add_destination(conn)
    enqueue(conn, dest, 6)
    claims = claim_for(conn, dest, 6)
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM destinations WHERE id = %s FOR NO KEY UPDATE", [dest])
        queue_sync.execute(conn, "SET lock_timeout = '2s'")
        assert record(conn, claims[:3], "delivered") == 3
        with pytest.raises(psycopg.errors.LockNotAvailable):
            record(conn, claims[3:], "retry")  # a failure does change the breaker row
        holder.rollback()
    assert record(conn, claims[3:], "retry") == 3


def test_claim_leaves_out_destinations_a_worker_skips(conn: psycopg.Connection) -> None:
    """A worker whose requests to one endpoint pile up unanswered asks for none of its
    deliveries; everyone else's still come, in the same claim."""
    slow = add_destination(conn)
    capped_slow = add_destination(conn, max_in_flight=5)
    healthy = add_destination(conn)
    for destination in (slow, capped_slow, healthy):
        enqueue(conn, destination, 3)
    got = queue_sync.claim_batch(conn, "w", 100, LEASE_MS, skip_destinations=[slow, capped_slow])
    assert {c.destination_id for c in got} == {healthy} and len(got) == 3
    assert len(queue_sync.claim_batch(conn, "w", 100, LEASE_MS)) == 6


def test_open_breakers_backlog_moves_out_of_the_claims_way(conn: psycopg.Connection) -> None:
    from engine.maintenance.breaker_defer import defer_open_breakers

    dead = add_destination(conn)
    probing = add_destination(conn)
    healthy = add_destination(conn)
    enqueue(conn, dead, 30)
    enqueue(conn, probing, 3)
    open_breaker(conn, dead)
    conn.execute("UPDATE destinations SET paused_until = now() + interval '1 minute'"
                 " WHERE id = %s", [dead])
    conn.execute("UPDATE destinations SET breaker = 'half_open', paused_until = now()"
                 " + interval '1 minute' WHERE id = %s", [probing])
    enqueue(conn, healthy, 5)
    assert defer_open_breakers(conn, batch=7) == 30
    assert one(conn, "SELECT count(*) FROM deliveries d JOIN destinations dest"
                     " ON dest.id = d.destination_id WHERE d.destination_id = %s"
                     " AND d.next_attempt_at = dest.paused_until", dead) == 30
    # Half-open (a probe out): left alone, its deliveries are due the moment it closes.
    assert one(conn, "SELECT count(*) FROM deliveries WHERE destination_id = %s"
                     " AND next_attempt_at <= now()", probing) == 3
    assert defer_open_breakers(conn) == 0
    assert {c.destination_id for c in queue_sync.claim_batch(conn, "w", 100, LEASE_MS)} == {healthy}
    # The pause ends exactly when the deferred deliveries fall due: one probe, then the rest.
    conn.execute("UPDATE deliveries SET next_attempt_at = now() - interval '1 second'"
                 " WHERE destination_id = %s", [dead])
    end_pause(conn, dead)
    probe = claim_for(conn, dead)
    assert len(probe) == 1
    record(conn, probe, "delivered")
    assert len(claim_for(conn, dead)) == 30 - 1

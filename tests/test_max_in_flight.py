"""max_in_flight: a destination's cap holds across concurrent claimers."""

from __future__ import annotations

import random
import threading
from functools import partial

import psycopg
import pytest

from engine.db import queue
from engine.db.queue import EventIn, Result
from tests.kit import queue_sync
from tests.kit.data import LEASE_MS, add_destination, now
from tests.kit.threads import run_threads

pytestmark = pytest.mark.pg_versions


def in_flight(conn: psycopg.Connection, destination: int) -> int:
    row = conn.execute("SELECT count(*) FROM deliveries WHERE destination_id = %s"
                       " AND status = 'in_flight'", [destination]).fetchone()
    assert row is not None
    return int(row[0])


def test_claim_stops_at_the_cap_and_refills(conn: psycopg.Connection) -> None:
    capped = add_destination(conn, max_in_flight=3)
    free = add_destination(conn)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [capped, free]) for _ in range(10)])
    first = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    assert sum(c.destination_id == capped for c in first) == 3
    assert sum(c.destination_id == free for c in first) == 10
    assert queue_sync.claim_batch(conn, "w", 100, LEASE_MS) == []
    done = next(c for c in first if c.destination_id == capped)
    t = now(conn)
    queue_sync.record_results(conn, "w", [Result(done.id, 1, "delivered", t, 1, 200)])
    again = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    assert [c.destination_id for c in again] == [capped]


def test_a_claim_says_whether_it_filled_the_cap(conn: psycopg.Connection) -> None:
    """fills_cap: the claim took the last free slots of its destination (the worker then
    records those results at once, for the claimers turned away meanwhile)."""
    filled = add_destination(conn, max_in_flight=3)
    roomy = add_destination(conn, max_in_flight=50)
    free = add_destination(conn)
    with conn.transaction():
        queue_sync.enqueue_events(
            conn, [EventIn("t", "{}", [filled, roomy, free]) for _ in range(5)])
    claims = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    by_destination = {d: {c.fills_cap for c in claims if c.destination_id == d}
                      for d in (filled, roomy, free)}
    assert by_destination == {filled: {True}, roomy: {False}, free: {False}}
    assert sum(c.destination_id == filled for c in claims) == 3


def test_capped_backlog_does_not_shrink_the_batch(conn: psycopg.Connection) -> None:
    """Capped rows first in line must not take the batch's slots from other destinations."""
    capped = add_destination(conn, max_in_flight=2)
    free = add_destination(conn)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [capped]) for _ in range(50)])
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [free]) for _ in range(20)])
    got = queue_sync.claim_batch(conn, "w", 10, LEASE_MS)
    assert len(got) == 10 and sum(c.destination_id == capped for c in got) == 2


def test_cap_holds_under_concurrent_claimers(dsn: str, conn: psycopg.Connection) -> None:
    cap = 4
    capped = add_destination(conn, max_in_flight=cap)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [capped]) for _ in range(300)])
    over: list[int] = []
    stop = threading.Event()

    def worker(slot: int) -> None:
        rng = random.Random(slot)
        name = f"w{slot}"
        with psycopg.connect(dsn, autocommit=True) as own:
            while not stop.is_set():
                claims = queue_sync.claim_batch(own, name, rng.randint(1, 5), LEASE_MS)
                seen = in_flight(own, capped)
                if seen > cap:
                    over.append(seen)
                if not claims:
                    if in_flight(own, capped) == 0 and not own.execute(
                            "SELECT 1 FROM deliveries LIMIT 1").fetchone():
                        return
                    continue
                t = now(own)
                outcomes = [rng.choice(["delivered", "delivered", "retry"]) for _ in claims]
                queue_sync.record_results(own, name, [
                    Result(c.id, c.attempt, o, t, 1, 200, None, None,
                           t if o == "retry" else None)
                    for c, o in zip(claims, outcomes, strict=True)
                ], queue.BreakerSettings(threshold=10_000))

    try:
        run_threads([partial(worker, i) for i in range(6)], 120, stop)
    finally:
        stop.set()  # the others, should one have failed or hung
    assert over == []
    assert conn.execute("SELECT count(*) FROM finished_deliveries").fetchone() == (300,)

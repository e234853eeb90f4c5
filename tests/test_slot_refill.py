"""refill_slots.sql: a result write that claims the capped slots its successes gave back,
for the same worker, in the same transaction (queue_sync.record_results_and_refill)."""

from __future__ import annotations

import asyncio

import msgspec
import psycopg
import pytest

from engine.db import queries, queue, queue_async
from engine.db.queue import Claim, EventIn, Result
from engine.maintenance.reaper import reap_expired
from tests.kit import queue_sync
from tests.kit.data import LEASE_MS, add_destination, now

pytestmark = pytest.mark.pg_versions

MAX_ATTEMPTS = 4


def slot_counter(conn: psycopg.Connection, destination: int) -> int:
    row = conn.execute("SELECT in_flight FROM destinations WHERE id = %s",
                       (destination,)).fetchone()
    assert row is not None
    return int(row[0])


def holding(conn: psycopg.Connection, destination: int, worker: str) -> list[int]:
    """The ids of `worker`'s in-flight deliveries to `destination` that hold a slot."""
    return [r[0] for r in conn.execute(
        "SELECT id FROM deliveries WHERE destination_id = %s AND status = 'in_flight'"
        " AND holds_slot AND locked_by = %s ORDER BY id", (destination, worker)).fetchall()]


def capped_backlog(conn: psycopg.Connection, cap: int, events: int) -> int:
    destination = add_destination(conn, max_in_flight=cap)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", f'{{"n": {n}}}', [destination])
                                    for n in range(events)])
    return destination


def delivered(conn: psycopg.Connection, claims: list[queue.Claim]) -> list[Result]:
    t = now(conn)
    return [Result(c.id, c.attempt, "delivered", t, 3, 200, None, None, None, c.claim_token)
            for c in claims]


def test_successes_take_their_slots_again_with_the_next_due_deliveries(
    conn: psycopg.Connection,
) -> None:
    destination = capped_backlog(conn, cap=3, events=8)
    first = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    assert len(first) == 3 and all(c.fills_cap for c in first)
    refilled = queue_sync.record_results_and_refill(
        conn, "w", delivered(conn, first[:2]), LEASE_MS, {destination: 2})
    # The two oldest pending deliveries, for the same worker, each holding a slot.
    pending_before = sorted(c.id for c in first)[-1]
    assert sorted(c.id for c in refilled) == [pending_before + 1, pending_before + 2]
    assert all(c.fills_cap and c.claim_token for c in refilled)
    assert holding(conn, destination, "w") == sorted([first[2].id, *(c.id for c in refilled)])
    assert slot_counter(conn, destination) == 3
    # The claim has no room left: the refill kept the slots to this worker.
    assert queue_sync.claim_batch(conn, "other", 100, LEASE_MS) == []


def test_a_refill_never_takes_more_than_the_cap_leaves(conn: psycopg.Connection) -> None:
    """Asked for more slots than the batch freed (or the cap lowered meanwhile), the
    refill takes only the room under the cap."""
    destination = capped_backlog(conn, cap=3, events=8)
    first = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    refilled = queue_sync.record_results_and_refill(
        conn, "w", delivered(conn, first[:1]), LEASE_MS, {destination: 5})
    assert len(refilled) == 1 and slot_counter(conn, destination) == 3
    conn.execute("UPDATE destinations SET max_in_flight = 1 WHERE id = %s", (destination,))
    refilled = queue_sync.record_results_and_refill(
        conn, "w", delivered(conn, refilled), LEASE_MS, {destination: 1})
    assert refilled == [] and slot_counter(conn, destination) == 2


@pytest.mark.parametrize("change", [
    "paused = true",
    "disabled = true",
    "rate_limit = 10",
])
def test_no_refill_for_a_destination_that_may_not_be_claimed(
    conn: psycopg.Connection, change: str
) -> None:
    destination = capped_backlog(conn, cap=2, events=5)
    first = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    conn.execute(f"UPDATE destinations SET {change} WHERE id = %s", (destination,))
    refilled = queue_sync.record_results_and_refill(
        conn, "w", delivered(conn, first), LEASE_MS, {destination: 2})
    assert refilled == [] and slot_counter(conn, destination) == 0


def test_no_refill_when_the_batch_opens_the_breaker(conn: psycopg.Connection) -> None:
    """A success followed by failures that open the breaker: the refill sees the breaker
    as the batch left it."""
    destination = capped_backlog(conn, cap=2, events=5)
    first = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    t = now(conn)
    results = [*delivered(conn, first[:1]),
               Result(first[1].id, first[1].attempt, "retry", t, 3, 500, "HTTP 500", None, t,
                      first[1].claim_token)]
    refilled = queue_sync.record_results_and_refill(
        conn, "w", results, LEASE_MS, {destination: 1}, queue.BreakerSettings(threshold=1))
    assert refilled == [] and slot_counter(conn, destination) == 0


def test_a_result_that_changed_nothing_refills_nothing(conn: psycopg.Connection) -> None:
    """A late result (its claim reaped) took no lock on the destination: its slot is not
    this worker's to refill, and another claimer may be changing the counter."""
    destination = capped_backlog(conn, cap=2, events=5)
    first = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    conn.execute("UPDATE deliveries SET locked_until = now() - interval '1 s'")
    reap_expired(conn, MAX_ATTEMPTS)
    assert slot_counter(conn, destination) == 0
    refilled = queue_sync.record_results_and_refill(
        conn, "w", delivered(conn, first), LEASE_MS, {destination: 2})
    assert refilled == [] and slot_counter(conn, destination) == 0
    assert len(queue_sync.claim_batch(conn, "other", 100, LEASE_MS)) == 2


def test_only_destinations_not_refilled_wake_the_claimers(
    dsn: str, conn: psycopg.Connection
) -> None:
    """A full cap's freed slots wake idle claimers (record_results.sql), but not those the
    same write takes again."""
    refilled_one = capped_backlog(conn, cap=1, events=3)
    other = capped_backlog(conn, cap=1, events=3)
    first = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    assert {c.destination_id for c in first} == {refilled_one, other}
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {queries.NOTIFY_CHANNEL}")
        queue_sync.record_results_and_refill(
            conn, "w", delivered(conn, [c for c in first if c.destination_id == refilled_one]),
            LEASE_MS, {refilled_one: 1})
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        queue_sync.record_results_and_refill(
            conn, "w", delivered(conn, [c for c in first if c.destination_id == other]),
            LEASE_MS, {})
        assert len(list(listener.notifies(timeout=5, stop_after=1))) == 1


def test_a_claim_that_locked_its_most_capped_destinations_wakes_every_claimer(
    conn: psycopg.Connection, dsn: str,
) -> None:
    """More capped destinations with room than one claim locks (CAPPED_LOCKS_PER_CLAIM):
    the claim notifies every claimer, which share the rest. A claim that claimed nothing
    (here: every destination left out) wakes nobody, or the claimers would lock the same
    destinations again and again."""
    destinations = [capped_backlog(conn, cap=2, events=2)
                    for _ in range(queue.CAPPED_LOCKS_PER_CLAIM + 1)]

    async def claim(skip: list[int]) -> tuple[list[Claim], int]:
        async with (
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener,
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as claimer,
        ):
            await listener.execute(f"LISTEN {queries.NOTIFY_CHANNEL}")
            batch = await queue_async.claim_batch(claimer, "w", 500, LEASE_MS, 0, skip)
            woken = [n async for n in listener.notifies(timeout=0.5)]
        return batch, len(woken)

    claims, woken = asyncio.run(claim(destinations))
    assert claims == [] and woken == 0
    claims, woken = asyncio.run(claim([]))
    assert woken == 1
    # The claim locked its most capped destinations, took their slots, and no others.
    assert len({c.destination_id for c in claims}) == queue.CAPPED_LOCKS_PER_CLAIM
    assert len(claims) == 2 * queue.CAPPED_LOCKS_PER_CLAIM


def test_the_async_write_records_and_refills_in_one_transaction(
    dsn: str, conn: psycopg.Connection
) -> None:
    """queue_async's write sends no BEGIN or COMMIT: the pipeline's statements up to its
    Sync are one transaction. The refill finds the destination only in the transaction
    whose record_results locked it, so refilled claims show the two shared one."""
    destination = capped_backlog(conn, cap=2, events=5)
    first = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)

    async def write() -> list[queue.Claim]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as own:
            return await queue_async.record_results_and_refill(
                own, "w", delivered(conn, first), LEASE_MS, {destination: 2})

    refilled = asyncio.run(write())
    assert len(refilled) == 2 and all(c.fills_cap for c in refilled)
    assert holding(conn, destination, "w") == sorted(c.id for c in refilled)
    assert slot_counter(conn, destination) == 2
    assert conn.execute("SELECT count(*) FROM finished_deliveries").fetchone() == (2,)


def test_a_failed_async_refill_leaves_the_results_unrecorded(
    dsn: str, conn: psycopg.Connection
) -> None:
    """If the refill fails, the record before it in the pipeline is rolled back too: the
    results stay to be written again, and the slots stay counted as the rows hold them."""
    destination = capped_backlog(conn, cap=2, events=5)
    first = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as own:
            # A lease past the end of time: the refill's UPDATE fails on its first row.
            await queue_async.record_results_and_refill(
                own, "w", delivered(conn, first), 10**18, {destination: 2})

    with pytest.raises(psycopg.errors.DatetimeFieldOverflow):
        asyncio.run(write())
    assert holding(conn, destination, "w") == sorted(c.id for c in first)
    assert slot_counter(conn, destination) == 2
    assert conn.execute("SELECT count(*) FROM finished_deliveries").fetchone() == (0,)


@pytest.mark.parametrize(("announce", "limit", "woken"), [
    (True, 5, 1),  # a full claim after a poll: a backlog nobody announced
    (True, 50, 0),  # it came back short: nothing left for the others
    (False, 5, 0),  # after a NOTIFY: every claimer was woken already
])
def test_a_full_claim_after_a_poll_wakes_every_claimer(
    conn: psycopg.Connection, dsn: str, announce: bool, limit: int, woken: int,
) -> None:
    destination = add_destination(conn)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [destination]) for _ in range(10)])

    async def claim() -> tuple[int, int]:
        async with (
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener,
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as claimer,
        ):
            await listener.execute(f"LISTEN {queries.NOTIFY_CHANNEL}")
            claims = await queue_async.claim_batch(claimer, "w", limit, LEASE_MS,
                                                   announce_backlog=announce)
            notified = [n async for n in listener.notifies(timeout=0.5)]
        return len(claims), len(notified)

    assert asyncio.run(claim()) == (min(limit, 10), woken)


def test_spares_come_after_the_slots_and_take_none(conn: psycopg.Connection) -> None:
    """A refill asked for spares claims them after the slot takers, in due order, for the
    same worker, and leaves the counter at the slots taken."""
    destination = capped_backlog(conn, cap=2, events=8)
    first = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    refilled = queue_sync.record_results_and_refill(
        conn, "w", delivered(conn, first), LEASE_MS, {destination: 2}, spares={destination: 3})
    takers = [c for c in refilled if c.holds_slot]
    spares = [c for c in refilled if not c.holds_slot]
    assert len(takers) == 2 and len(spares) == 3
    assert max(c.id for c in takers) < min(c.id for c in spares)
    assert not any(c.fills_cap for c in spares)
    assert holding(conn, destination, "w") == sorted(c.id for c in takers)
    assert slot_counter(conn, destination) == 2
    in_flight = conn.execute("SELECT count(*) FROM deliveries WHERE destination_id = %s"
                             " AND status = 'in_flight' AND locked_by = 'w'",
                             (destination,)).fetchone()
    assert in_flight == (5,)


def test_a_success_hands_its_slot_on_to_a_spare(conn: psycopg.Connection) -> None:
    """The spare takes the slot (the counter stays), unless its own result is in the same
    batch: then the source's slot is freed and the spare gives back none."""
    destination = capped_backlog(conn, cap=2, events=8)
    first = queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
    spares = queue_sync.record_results_and_refill(
        conn, "w", [], LEASE_MS, {}, spares={destination: 2})
    assert len(spares) == 2 and not any(c.holds_slot for c in spares)
    handing = [msgspec.structs.replace(r, slot_to=s.id, slot_to_token=s.claim_token)
               for r, s in zip(delivered(conn, first), spares, strict=True)]
    queue_sync.record_results(conn, "w", handing[:1])
    assert holding(conn, destination, "w") == sorted([first[1].id, spares[0].id])
    assert slot_counter(conn, destination) == 2
    # The second spare answered too, in the same batch as the result handing to it.
    queue_sync.record_results(conn, "w", [handing[1], *delivered(conn, spares[1:])])
    assert holding(conn, destination, "w") == [spares[0].id]
    assert slot_counter(conn, destination) == 1

"""The queue operations. Each is one SQL statement (see engine/sql/) run in its own short
transaction; none of them holds a connection while anything but the database works."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from psycopg import AsyncConnection, Connection

from engine import queries
from engine.database import (
    repeat_until_short,
    repeat_until_short_async,
    run_statement,
    run_statement_async,
)
from engine.domain import (
    OUTCOMES,
    BreakerSettings,
    Claim,
    EventIn,
    Result,
    worker_id,
)
from engine.sql_params import (
    ClaimBatchParams,
    EnqueueEventsParams,
    LockCappedDestinationsParams,
    RecordResultsParams,
    RefillSlotsParams,
    ReplayDeadParams,
    ReplayDeliveryParams,
    ReturnClaimsParams,
    TakeRateTokensParams,
)

# Re-exported: tests, bench and tools name the domain types through engine.queue.
__all__ = ["BreakerSettings", "Claim", "EventIn", "Result", "worker_id"]

# pg_advisory_xact_lock(class, destination id) key space: "changing this destination's
# slot count or breaker" (claims for a capped destination, result writes, the reaper: see
# lock_capped_destinations.sql and record_results.sql). Two-int keys never collide with the
# one-bigint keys used elsewhere.
BREAKER_LOCK_CLASS = 0x656E68
# One key space for both: a result write takes one lock per destination for its breaker
# and its slot counter together.
CAPPED_CLAIM_LOCK_CLASS = BREAKER_LOCK_CLASS
# Capped destinations one claim locks at most (lock_capped_destinations.sql): each lock is
# held until the claim commits, and other claimers and result writes of those destinations
# wait for it. A claim that locked this many may have left others with room and due work:
# the claim loop claims again at once instead of waiting for a notification.
CAPPED_LOCKS_PER_CLAIM = 32
RETURN_BATCH = 1000
REPLAY_BATCH = 500

_RESULTS_ENCODER = msgspec.json.Encoder()


# A row of take_rate_tokens.sql: destination id, tokens, first send time, statement time.
RateBooking = tuple[int, int, dt.datetime, dt.datetime]


def claim_params(
    worker: str, limit: int, lease_ms: int, first_attempt_reserve: int, capped: list[int],
    skip_destinations: Sequence[int] = (), rate_tokens: Sequence[RateBooking] = (),
) -> tuple[object, ...]:
    """Parameters of claim_batch.sql (shared by the sync and async queue functions);
    `capped` is what lock_capped_destinations.sql returned in the same transaction, and
    `rate_tokens` the rows of take_rate_tokens.sql."""
    return ClaimBatchParams(
        worker_id=worker, limit=limit, first_attempt_reserve=first_attempt_reserve,
        lease_ms=lease_ms, capped_destination_ids=capped,
        destination_ids=list(skip_destinations),
        rate_limited_destination_ids=[booking[0] for booking in rate_tokens],
        tokens=[booking[1] for booking in rate_tokens],
    )


def claims_from_rows(
    rows: Sequence[Sequence[Any]], rate_tokens: Sequence[RateBooking]
) -> list[Claim]:
    """claim_batch.sql's rows as Claims. A rate-limited destination's claims take the send
    times its row of take_rate_tokens.sql booked, 1/rate apart from the first, in id order
    (the order they were enqueued in); claim_batch.sql gave back those left over."""
    if not rate_tokens:
        return [Claim(*row) for row in rows]
    booked = {booking[0]: booking for booking in rate_tokens}
    claims: list[Claim] = []
    rated: dict[int, list[Sequence[Any]]] = {}
    for row in rows:
        if row[_DESTINATION_COLUMN] in booked:
            rated.setdefault(row[_DESTINATION_COLUMN], []).append(row)
        else:
            claims.append(Claim(*row))
    for destination, destination_rows in rated.items():
        _, _, first_send_at, statement_at = booked[destination]
        first_delay_s = (first_send_at - statement_at).total_seconds()
        interval_s = 1 / destination_rows[0][_RATE_LIMIT_COLUMN]
        destination_rows.sort(key=lambda row: row[0])
        for k, row in enumerate(destination_rows):
            offset_s = k * interval_s
            claims.append(Claim(*row, first_send_at + dt.timedelta(seconds=offset_s),
                                first_delay_s + offset_s))
    return claims


# Where claim_batch.sql's rows (Claim's fields, in order) have these.
_DESTINATION_COLUMN = Claim.__struct_fields__.index("destination_id")
_RATE_LIMIT_COLUMN = Claim.__struct_fields__.index("rate_limit")


def rate_token_params(limit: int, skip_destinations: Sequence[int] = ()) -> tuple[object, ...]:
    """Parameters of take_rate_tokens.sql."""
    return TakeRateTokensParams(limit=limit, destination_ids=list(skip_destinations))


def lock_capped_params() -> tuple[object, ...]:
    """Parameters of lock_capped_destinations.sql."""
    return LockCappedDestinationsParams(advisory_lock_class=CAPPED_CLAIM_LOCK_CLASS,
                                        limit=CAPPED_LOCKS_PER_CLAIM)


def record_params(
    worker: str, results: Sequence[Result], breaker: BreakerSettings | None = None,
    refilled: Sequence[int] = (),
) -> tuple[object, ...]:
    """Parameters of record_results.sql: the whole batch as one JSON document;
    `refilled`: the destinations refill_slots.sql refills after it."""
    breaker = breaker or BreakerSettings()
    for r in results:
        if r.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {r.outcome!r}")
    return RecordResultsParams(
        worker_id=worker,
        results=_RESULTS_ENCODER.encode(results).decode(),
        breaker_threshold=breaker.threshold,
        breaker_base_pause_ms=breaker.base_pause_ms,
        breaker_max_pause_ms=breaker.max_pause_ms,
        advisory_lock_class=BREAKER_LOCK_CLASS,
        notification_channel=queries.NOTIFY_CHANNEL,
        refilled_destination_ids=list(refilled),
    )


def refill_params(
    worker: str, lease_ms: int, refill: Mapping[int, int], spares: Mapping[int, int] = {},
) -> tuple[object, ...]:
    """Parameters of refill_slots.sql; `refill`: destination id -> slots it may take,
    `spares`: destination id -> spares (claims that take no slot) it may take."""
    destinations = list(refill) + [d for d in spares if d not in refill]
    return RefillSlotsParams(
        worker_id=worker, lease_ms=lease_ms, destination_ids=destinations,
        slots=[refill.get(d, 0) for d in destinations],
        spares=[spares.get(d, 0) for d in destinations])


def return_params(
    worker: str | None, only_expired: bool, reason: str, max_attempts: int
) -> tuple[object, ...]:
    """Parameters of return_claims.sql for one batch of at most RETURN_BATCH claims."""
    return ReturnClaimsParams(
        locked_by=worker, only_expired=only_expired, reason=reason, max_attempts=max_attempts,
        batch_limit=RETURN_BATCH, advisory_lock_class=BREAKER_LOCK_CLASS,
    )


def claim_batch(
    conn: Connection, worker: str, limit: int, lease_ms: int, first_attempt_reserve: int = 0,
    skip_destinations: Sequence[int] = (),
) -> list[Claim]:
    """Claim up to `limit` due deliveries for `worker`, none of `skip_destinations`;
    commits before returning."""
    with conn.transaction():
        # Two statements: the claim's snapshot must be taken after the capped
        # destinations' locks (see lock_capped_destinations.sql).
        capped = [row[0] for row in run_statement(
            conn, queries.LOCK_CAPPED_DESTINATIONS, lock_capped_params()
        ).fetchall()]
        tokens = run_statement(
            conn, queries.TAKE_RATE_TOKENS, rate_token_params(limit, skip_destinations)
        ).fetchall()
        params = claim_params(
            worker, limit, lease_ms, first_attempt_reserve, capped, skip_destinations, tokens
        )
        rows = run_statement(conn, queries.CLAIM_BATCH, params).fetchall()
    return claims_from_rows(rows, tokens)


def record_results(
    conn: Connection, worker: str, results: Sequence[Result],
    breaker: BreakerSettings | None = None,
) -> int:
    """Apply many attempt outcomes in one statement; returns how many still belonged to
    `worker` (the rest were reaped or released meanwhile and change nothing). Finished
    deliveries move to finished_deliveries in the same statement
    (docs/decisions/0001-move-deliveries-at-completion.md)."""
    if not results:
        return 0
    params = record_params(worker, results, breaker)
    with conn.transaction():
        row = run_statement(conn, queries.RECORD_RESULTS, params).fetchone()
    return int(row[0]) if row else 0


def record_results_and_refill(
    conn: Connection, worker: str, results: Sequence[Result], lease_ms: int,
    refill: Mapping[int, int], breaker: BreakerSettings | None = None,
    spares: Mapping[int, int] = {},
) -> list[Claim]:
    """record_results, then in the same transaction claim for `worker` the next due
    deliveries of capped destinations whose slots the batch gave back (`refill`:
    destination id -> at most this many; refill_slots.sql says which are refilled), and
    `spares` (destination id -> at most this many) that take no slot."""
    with conn.transaction():
        run_statement(conn, queries.RECORD_RESULTS,
                      record_params(worker, results, breaker, list(refill)))
        rows = run_statement(conn, queries.REFILL_SLOTS,
                             refill_params(worker, lease_ms, refill, spares)).fetchall()
    return claims_from_rows(rows, ())


def release_claims(conn: Connection, worker: str, max_attempts: int) -> int:
    """Return every claim of `worker` (a process that died) to pending at once."""
    return return_claims(conn, worker, False, "worker exited", max_attempts)


def return_claims(
    conn: Connection, worker: str | None, only_expired: bool, reason: str, max_attempts: int
) -> int:
    """Return claims to pending, RETURN_BATCH per transaction: every claim of `worker`
    (None: any holder), or only those whose lease ran out."""
    params = return_params(worker, only_expired, reason, max_attempts)

    def one_batch() -> int:
        with conn.transaction():
            row = run_statement(conn, queries.RETURN_CLAIMS, params).fetchone()
        return int(row[0]) + int(row[1]) if row else 0

    return repeat_until_short(one_batch, RETURN_BATCH)[0]


def replay_delivery(conn: Connection, delivery_id: int) -> bool:
    """Put one delivery back as a first attempt; False if it is in flight or unknown."""
    with conn.transaction():
        row = run_statement(
            conn, queries.REPLAY_DELIVERY, ReplayDeliveryParams(delivery_id=delivery_id)
        ).fetchone()
    return row is not None


def replay_dead(
    conn: Connection, destination_id: int, since: dt.datetime | None = None,
    batch: int = REPLAY_BATCH,
) -> int:
    """Replay every dead delivery of a destination (since a time) in bounded batches."""
    with conn.transaction():
        started = run_statement(conn, queries.DATABASE_NOW, ()).fetchone()
    until = started[0] if started else None
    params = ReplayDeadParams(
        destination_id=destination_id, since=since, until=until, batch_limit=batch)

    def one_batch() -> int:
        with conn.transaction():
            return int(run_statement(conn, queries.REPLAY_DEAD, params).fetchone()[0])

    return repeat_until_short(one_batch, batch)[0]


def _enqueue_params(events: Sequence[EventIn]) -> tuple[list[object], ...]:
    target_ord: list[int] = []
    target_dest: list[int] = []
    for position, event in enumerate(events, start=1):
        for destination_id in event.destination_ids or ():
            target_ord.append(position)
            target_dest.append(destination_id)
    return EnqueueEventsParams(
        types=[e.type for e in events],
        payloads=[e.payload for e in events],
        ordering_keys=[e.ordering_key for e in events],
        idempotency_keys=[e.idempotency_key for e in events],
        request_hashes=[e.request_hash for e in events],
        explicit=[e.destination_ids is not None for e in events],
        target_ord=target_ord,
        target_destination_id=target_dest,
    )


def _enqueue_answers(rows: Sequence[tuple]) -> list[tuple[int | None, int]]:
    return [(row[1], int(row[2]) if row[2] is not None else 0) for row in rows]


def enqueue_events(conn: Connection, events: Sequence[EventIn]) -> list[tuple[int | None, int]]:
    """Insert events and their deliveries in one statement, inside the caller's transaction.
    Returns (event id, delivery count) per event; id None where the idempotency key exists."""
    rows = run_statement(conn, queries.ENQUEUE_EVENTS, _enqueue_params(events)).fetchall()
    return _enqueue_answers(rows)


async def enqueue_events_async(
    conn: AsyncConnection, events: Sequence[EventIn]
) -> list[tuple[int | None, int]]:
    """`enqueue_events` on an asyncio connection. In autocommit the statement is its own
    transaction: one round trip, committed when it returns."""
    cursor = await run_statement_async(conn, queries.ENQUEUE_EVENTS, _enqueue_params(events))
    return _enqueue_answers(await cursor.fetchall())


async def replay_delivery_async(conn: AsyncConnection, delivery_id: int) -> bool:
    """`replay_delivery` on an asyncio connection."""
    async with conn.transaction():
        cursor = await run_statement_async(
            conn, queries.REPLAY_DELIVERY, ReplayDeliveryParams(delivery_id=delivery_id))
        row = await cursor.fetchone()
    return row is not None


async def replay_dead_async(
    conn: AsyncConnection, destination_id: int, since: dt.datetime | None = None,
    batch: int = REPLAY_BATCH,
) -> int:
    """`replay_dead` on an asyncio connection: bounded batches, each its own transaction."""
    async with conn.transaction():
        cursor = await run_statement_async(conn, queries.DATABASE_NOW, ())
        started = await cursor.fetchone()
    until = started[0] if started else None
    params = ReplayDeadParams(
        destination_id=destination_id, since=since, until=until, batch_limit=batch)

    async def one_batch() -> int:
        async with conn.transaction():
            cursor = await run_statement_async(conn, queries.REPLAY_DEAD, params)
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    return await repeat_until_short_async(one_batch, batch)

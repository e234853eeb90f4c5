"""The queue's operations on asyncio connections, one function each, as production runs
them: the worker's claim and result writes, ingress's insert of events, the API's replays,
and the NOTIFY that wakes the claimers. Each runs engine/sql/ statements through
engine/db/queries.py in short transactions (or one autocommit statement); none holds a
connection while anything but the database works. Claims given back (the supervisor, the
reaper) run on synchronous connections: engine/db/queue.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from psycopg import AsyncConnection

from engine.db import queries, send_schedule
from engine.db.queue import (
    BREAKER_LOCK_CLASS,
    CAPPED_CLAIM_LOCK_CLASS,
    CAPPED_LOCKS_PER_CLAIM,
    LIMITED_TENANTS_PER_CLAIM,
    REPLAY_BATCH,
    TENANT_LOCK_CLASS,
)
from engine.db.sql_params import (
    BookSendTimesParams,
    ClaimBatchParams,
    ClaimLimitedTenantsParams,
    EnqueueEventsParams,
    LockCappedDestinationsParams,
    LockLimitedTenantsParams,
    NotifyDeliveriesParams,
    RecordResultsParams,
    RefillSlotsParams,
    ReplayDeadParams,
    TakeRateTokensParams,
    TenantDeliveryParams,
)
from engine.domain import OUTCOMES, BreakerSettings, Claim, EventIn, Result

_RESULTS_ENCODER = msgspec.json.Encoder()
_LOCK_CAPPED = LockCappedDestinationsParams(
    advisory_lock_class=CAPPED_CLAIM_LOCK_CLASS, limit=CAPPED_LOCKS_PER_CLAIM)
_LOCK_LIMITED = LockLimitedTenantsParams(
    advisory_lock_class=TENANT_LOCK_CLASS, limit=LIMITED_TENANTS_PER_CLAIM)
NOTIFY_PARAMS = NotifyDeliveriesParams(notification_channel=queries.NOTIFY_CHANNEL)

# A row of take_rate_tokens.sql: destination id, tokens, first send time, statement time.
RateBooking = tuple[int, int, dt.datetime, dt.datetime]


async def notify_deliveries(conn: AsyncConnection) -> None:
    """Wake the idle claimers (they LISTEN on queries.NOTIFY_CHANNEL)."""
    await queries.NOTIFY_DELIVERIES.run(conn, NOTIFY_PARAMS)


class TenantCursor:
    """Where a worker's next claim starts its round of the tenants with due work: below
    the tenant its last fair-share claim served last (claim_batch.sql, `tenant_walk`
    goes down the tenant ids; docs/decisions/0026). Kept in the worker's memory: each
    worker goes round on its own, and a new one (0) starts from the highest tenant."""

    __slots__ = ("after", "shared")

    def __init__(self) -> None:
        self.after = 0
        self.shared = False  # the last claim shared its room among tenants


async def claim_batch(
    conn: AsyncConnection, worker: str, limit: int, lease_ms: int, first_attempt_reserve: int = 0,
    skip_destinations: Sequence[int] = (), announce_backlog: bool = False,
    tenant_cursor: TenantCursor | None = None,
) -> list[Claim]:
    """Claim up to `limit` due deliveries for `worker`, none of `skip_destinations`;
    commits before returning. `announce_backlog`: nobody announced this work (the claim
    follows a poll, not a NOTIFY), so if the claim comes back full, wake every claimer.
    `tenant_cursor`: where the claim's share among tenants starts (none: from the highest
    tenant), moved past the tenants the claim shared its room among.

    Pipelined: BEGIN goes out with the first statement and COMMIT with the claim, two
    round trips instead of four. On a busy machine every round trip waits for the backend
    to be scheduled, and the claim is what a worker's free slots wait for."""
    async with conn.pipeline() as pipeline, conn.transaction():
        # The capped destinations' and the limited tenants' locks come first: the claims'
        # snapshots must be taken after them (lock_capped_destinations.sql,
        # lock_limited_tenants.sql). The rate-limit tokens go in the same round trip
        # (take_rate_tokens.sql).
        locked = await queries.LOCK_CAPPED_DESTINATIONS.run(conn, _LOCK_CAPPED)
        booked = await queries.TAKE_RATE_TOKENS.run(conn, TakeRateTokensParams(
            limit=limit, destination_ids=list(skip_destinations)))
        tenants_locked = await queries.LOCK_LIMITED_TENANTS.run(conn, _LOCK_LIMITED)
        await pipeline.sync()
        capped = [row[0] for row in await locked.fetchall()]
        tokens: list[RateBooking] = await booked.fetchall()
        limited_tenants = [row[0] for row in await tenants_locked.fetchall()]
        limited_rows: list[Sequence[Any]] = []
        if limited_tenants:
            # A round trip more, only while tenants with limits of their own have due
            # work: claim_batch.sql is bound to what this claim leaves of `limit`.
            limited = await queries.CLAIM_LIMITED_TENANTS.run(conn, ClaimLimitedTenantsParams(
                worker_id=worker, limit=limit, lease_ms=lease_ms, tenant_ids=limited_tenants,
                capped_destination_ids=capped, destination_ids=list(skip_destinations)))
            await pipeline.sync()
            limited_rows = await limited.fetchall()
        limited_claims, booked_times = _limited_claims(limited_rows)
        if booked_times.tenant_ids or booked_times.destination_ids:
            await queries.BOOK_SEND_TIMES.run(conn, booked_times)
        # Run even with no room left: it gives back the rate tokens booked above.
        claimed = await queries.CLAIM_BATCH.run(conn, ClaimBatchParams(
            worker_id=worker, limit=limit - len(limited_rows),
            first_attempt_reserve=first_attempt_reserve,
            lease_ms=lease_ms, capped_destination_ids=capped,
            destination_ids=list(skip_destinations),
            rate_limited_destination_ids=[booking[0] for booking in tokens],
            tokens=[booking[1] for booking in tokens],
            tenant_cursor=tenant_cursor.after if tenant_cursor is not None else 0,
        ))
    rows = await claimed.fetchall()
    # The last column is the same on every row: the tenant the fair share served last.
    if tenant_cursor is not None:
        tenant_cursor.shared = bool(rows) and rows[0][-1] is not None
        if tenant_cursor.shared:
            tenant_cursor.after = rows[0][-1]
    # claim_limited_tenants.sql set its claims' send times itself.
    claims = limited_claims + _claims([row[:-1] for row in rows], tokens)
    if (len(capped) >= CAPPED_LOCKS_PER_CLAIM and claims) or (
            announce_backlog and len(claims) >= limit):
        # A claim that locked its most capped destinations: others may have room and due
        # work too, and every claimer should share them rather than this one claiming
        # again (docs/decisions/0015-capped-slots-refilled-by-the-result-write.md). Not
        # after an empty claim: the destinations it locked may all be left out, and every
        # claimer would only lock them again.
        # A full claim after a poll found a backlog that fell due by time (retries, a
        # delay), which no NOTIFY announced: the idle claimers would each find it only at
        # their own poll (docs/decisions/0005-notify-gather-20ms.md).
        await notify_deliveries(conn)
    return claims


def claim_rows(rows: Sequence[Sequence[Any]]) -> list[Sequence[Any]]:
    """claim_batch.sql's (or refill_slots.sql's) rows with their destination's columns,
    which the statement sends on the first row of each destination only (NULL url on
    the others: a destination's url is NOT NULL)."""
    firsts = {row[_DESTINATION_COLUMN]: row for row in rows if row[_URL_COLUMN] is not None}
    if len(firsts) == len(rows):
        return rows
    filled: list[Sequence[Any]] = []
    for row in rows:
        if row[_URL_COLUMN] is None:
            first = firsts[row[_DESTINATION_COLUMN]]
            row = (*row[:4], *first[4:7], row[7], *first[8:13], row[13], *first[14:16],
                   *row[16:])
        filled.append(row)
    return filled


def _claims(rows: Sequence[Sequence[Any]], rate_tokens: Sequence[RateBooking]) -> list[Claim]:
    """claim_batch.sql's (or refill_slots.sql's) rows as Claims. A rate-limited
    destination's claims take the send times its row of take_rate_tokens.sql booked,
    1/rate apart from the first, in id order (the order they were enqueued in);
    claim_batch.sql gave back those left over."""
    rows = claim_rows(rows)
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


def _limited_claims(rows: Sequence[Sequence[Any]]) -> tuple[list[Claim], BookSendTimesParams]:
    """claim_limited_tenants.sql's rows as Claims, each rate-limited one with its send time
    (engine/db/send_schedule.py), and the next send times to book for them."""
    by_tenant: dict[int, list[Sequence[Any]]] = {}
    for row in rows:
        by_tenant.setdefault(row[_CLAIM_FIELDS], []).append(row)
    send_at: dict[int, dt.datetime] = {}
    booked = BookSendTimesParams(tenant_ids=[], tenant_next_send_times=[],
                                 destination_ids=[], destination_next_send_times=[])
    for tenant, tenant_rows in by_tenant.items():
        tenant_rate, tenant_first = tenant_rows[0][_CLAIM_FIELDS + 1:_CLAIM_FIELDS + 3]
        schedule = send_schedule.tenant_schedule(
            [send_schedule.Paced(row[0], row[_DESTINATION_COLUMN],
                                 row[_RATE_LIMIT_COLUMN] if row[-2] is not None else None,
                                 row[-2])
             for row in tenant_rows], tenant_rate, tenant_first)
        send_at |= schedule.send_at
        if schedule.tenant_next_send_at is not None:
            booked.tenant_ids.append(tenant)
            booked.tenant_next_send_times.append(schedule.tenant_next_send_at)
        for destination, next_send_at in schedule.destination_next_send_at.items():
            booked.destination_ids.append(destination)
            booked.destination_next_send_times.append(next_send_at)
    claims = []
    for row in rows:
        at = send_at.get(row[0])
        claims.append(Claim(*row[:_CLAIM_FIELDS]) if at is None else
                      Claim(*row[:_CLAIM_FIELDS], at, (at - row[-1]).total_seconds()))
    return claims, booked


# Where claim_batch.sql's rows (Claim's fields, in order) have these.
_DESTINATION_COLUMN = Claim.__struct_fields__.index("destination_id")
_URL_COLUMN = Claim.__struct_fields__.index("url")
# The destination's columns in a claim row: url, timeout_ms, secrets; max_in_flight up to
# egress_revision; propagate_trace, tenant_id (the rest are the delivery's or the event's).
assert Claim.__struct_fields__[4:7] == ("url", "timeout_ms", "secrets")
assert Claim.__struct_fields__[8:13] == ("max_in_flight", "headers", "retry_schedule",
                                         "rate_limit", "egress_revision")
assert Claim.__struct_fields__[14:16] == ("propagate_trace", "tenant_id")
_RATE_LIMIT_COLUMN = Claim.__struct_fields__.index("rate_limit")
# claim_limited_tenants.sql's rows: Claim's fields up to holds_slot, then the tenant's id,
# rate limit and first send time, the destination's first send time, the statement time.
_CLAIM_FIELDS = Claim.__struct_fields__.index("holds_slot") + 1


def record_params(
    worker: str, results: Sequence[Result], breaker: BreakerSettings | None = None,
    refilled: Sequence[int] = (),
) -> RecordResultsParams:
    """record_results.sql's parameters: the whole batch as one JSON document; `refilled`:
    the destinations refill_slots.sql refills after it in the same transaction."""
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
        tenant_advisory_lock_class=TENANT_LOCK_CLASS,
    )


async def record_results(
    conn: AsyncConnection, worker: str, results: Sequence[Result],
    breaker: BreakerSettings | None = None,
) -> int:
    """Apply many attempt outcomes in one statement; returns how many still belonged to
    `worker` (the rest were reaped or released meanwhile and change nothing). Finished
    deliveries move to finished_deliveries in the same statement
    (docs/decisions/0001-move-deliveries-at-completion.md). `conn` is in autocommit mode:
    the one statement is its own transaction (no BEGIN and COMMIT round trips)."""
    if not results:
        return 0
    params = record_params(worker, results, breaker)
    row = await (await queries.RECORD_RESULTS.run(conn, params)).fetchone()
    return int(row[0]) if row else 0


async def record_results_and_refill(
    conn: AsyncConnection, worker: str, results: Sequence[Result], lease_ms: int,
    refill: Mapping[int, int], breaker: BreakerSettings | None = None,
    spares: Mapping[int, int] = {},
) -> list[Claim]:
    """record_results, then in the same transaction claim for `worker` the next due
    deliveries of capped destinations whose slots the batch gave back (`refill`:
    destination id -> at most this many; refill_slots.sql says which are refilled), and
    `spares` (destination id -> at most this many) that take no slot.

    `conn` is in autocommit mode and the two statements are pipelined without BEGIN and
    COMMIT: in a pipeline, the statements up to its Sync are one transaction
    (PostgreSQL's extended protocol), which commits at the Sync and rolls back whole if
    one fails. BEGIN and COMMIT would each wait for a turn of the worker's event loop
    (docs/decisions/0015-capped-slots-refilled-by-the-result-write.md)."""
    destinations = list(refill) + [d for d in spares if d not in refill]
    refills = RefillSlotsParams(
        worker_id=worker, lease_ms=lease_ms, destination_ids=destinations,
        slots=[refill.get(d, 0) for d in destinations],
        spares=[spares.get(d, 0) for d in destinations])
    async with conn.pipeline():
        await queries.RECORD_RESULTS.run(
            conn, record_params(worker, results, breaker, list(refill)))
        refilled = await queries.REFILL_SLOTS.run(conn, refills)
    return _claims(await refilled.fetchall(), ())


def enqueue_params(events: Sequence[EventIn]) -> EnqueueEventsParams:
    """enqueue_events.sql's parameters: one array per column, and the explicit targets as
    (event position, destination id) pairs."""
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
        tenant_ids=[e.tenant_id for e in events],
        channels=[",".join(e.channels) if e.channels else None for e in events],
        filterable=[e.filterable for e in events],
        traceparents=[e.traceparent for e in events],
    )


async def enqueue_events(
    conn: AsyncConnection, events: Sequence[EventIn]
) -> list[tuple[int | None, int]]:
    """Insert events and their deliveries in one statement, inside the caller's
    transaction if any (in autocommit it is its own: one round trip, committed when it
    returns). Returns (event id, delivery count) per event; id None where the idempotency
    key exists."""
    cursor = await queries.ENQUEUE_EVENTS.run(conn, enqueue_params(events))
    return enqueued(await cursor.fetchall())


def enqueued(rows: Sequence[Sequence[Any]]) -> list[tuple[int | None, int]]:
    """enqueue_events.sql's rows as (event id or None, deliveries created), in order."""
    return [(row[1], int(row[2]) if row[2] is not None else 0) for row in rows]


async def replay_delivery(conn: AsyncConnection, tenant_id: int, delivery_id: int) -> bool:
    """Put one of the tenant's deliveries back as a first attempt; False if it is in
    flight or unknown (or another tenant's)."""
    async with conn.transaction():
        cursor = await queries.REPLAY_DELIVERY.run(
            conn, TenantDeliveryParams(delivery_id=delivery_id, tenant_id=tenant_id))
        row = await cursor.fetchone()
    return row is not None


async def replay_dead(
    conn: AsyncConnection, destination_id: int, since: dt.datetime | None = None,
    batch: int = REPLAY_BATCH,
) -> int:
    """Replay every dead delivery of a destination (since a time) that died before the
    call, in batches of `batch`, each its own transaction, until one comes back short."""
    async with conn.transaction():
        started = await (await queries.DATABASE_NOW.run(conn)).fetchone()
    params = ReplayDeadParams(destination_id=destination_id, since=since,
                              until=started[0] if started else None, batch_limit=batch)
    total = 0
    while True:
        async with conn.transaction():
            row = await (await queries.REPLAY_DEAD.run(conn, params)).fetchone()
        moved = int(row[0]) if row else 0
        total += moved
        if moved < batch:
            return total

"""The queue operations. Each is one SQL statement (see engine/sql/) run in its own short
transaction; none of them holds a connection while anything but the database works."""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from psycopg import AsyncConnection, AsyncRawCursor, Connection, RawCursor

from engine import queries

# Breaker defaults (SPEC): open after 5 consecutive failures, pause 30 s doubling to 1 h.
BREAKER_THRESHOLD = 5
BREAKER_BASE_PAUSE_MS = 30_000
BREAKER_MAX_PAUSE_MS = 3_600_000
# pg_advisory_xact_lock(class, destination id) key space: "changing this destination's
# slot count or breaker" (claims for a capped destination, result writes, the reaper: see
# lock_capped_destinations.sql and record_results.sql). Two-int keys never collide with the
# one-bigint keys used elsewhere.
BREAKER_LOCK_CLASS = 0x656E68
# One key space for both: a result write takes one lock per destination for its breaker
# and its slot counter together.
CAPPED_CLAIM_LOCK_CLASS = BREAKER_LOCK_CLASS
RETURN_BATCH = 1000
REPLAY_BATCH = 500


def _run(conn: Connection, statement: bytes, params: Sequence[object]) -> RawCursor:
    """Execute one of our .sql files: they use PostgreSQL's own $n placeholders."""
    cursor = RawCursor(conn)
    cursor.execute(statement, params)
    return cursor


async def _run_async(
    conn: AsyncConnection, statement: bytes, params: Sequence[object]
) -> AsyncRawCursor:
    """`_run` for the asyncio side (ingress): the same statements and parameters."""
    cursor = AsyncRawCursor(conn)
    await cursor.execute(statement, params)
    return cursor


def worker_id(tag: str = "", pid: int | None = None) -> str:
    """`host:pid` (plus a tag), so an operator can tell whose claim a row is. A supervisor
    passes a child's `pid` to name that child's claims."""
    base = f"{socket.gethostname()}:{os.getpid() if pid is None else pid}"
    return f"{base}:{tag}" if tag else base


class Claim(msgspec.Struct, frozen=True, gc=False):
    """One claimed delivery with all a worker needs to send it. gc=False (here, in Result
    and HttpResult): made per delivery and never in a reference cycle, so the cyclic
    collector need not track them, and a worker's collections stay short."""

    id: int
    event_id: int
    destination_id: int
    attempt: int
    url: str
    timeout_ms: int
    secrets: list[str]
    payload: str
    max_in_flight: int | None = None  # the destination's cap on concurrent requests
    headers: dict[str, str] | None = None  # the destination's static extra headers
    retry_schedule: list[float] | None = None  # its own retry delays (seconds), if any
    rate_limit: float | None = None  # its requests per second, if limited
    claim_token: int | None = None  # names this claim; its results carry it (schema/009)
    # This claim filled its destination's max_in_flight: claimers are being turned away
    # until a slot comes back, so the worker records its results sooner (worker.py).
    fills_cap: bool = False


OUTCOMES = frozenset({"delivered", "retry", "dead", "gone", "released"})


class Result(msgspec.Struct, frozen=True, gc=False):
    """The outcome of one attempt. `next_attempt_at` is set for 'retry' and 'gone'.
    A Struct, not a dataclass: a worker makes one per delivery (several times cheaper)."""

    id: int
    attempt: int
    outcome: str
    started_at: dt.datetime
    duration_ms: int | None = None
    status_code: int | None = None
    error: str | None = None
    body: str | None = None
    next_attempt_at: dt.datetime | None = None
    # The claim's token: the result applies only while that claim is the current one.
    claim_token: int | None = None


_RESULTS_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True)
class BreakerSettings:
    threshold: int = BREAKER_THRESHOLD
    base_pause_ms: int = BREAKER_BASE_PAUSE_MS
    max_pause_ms: int = BREAKER_MAX_PAUSE_MS


@dataclass
class EventIn:
    """One event to enqueue. `destination_ids` None means fan out by event type."""

    type: str
    payload: str
    destination_ids: Sequence[int] | None = None
    ordering_key: str | None = None
    idempotency_key: str | None = None
    request_hash: bytes | None = None


def claim_params(
    worker: str, limit: int, lease_ms: int, first_attempt_reserve: int, capped: list[int],
    skip_destinations: Sequence[int] = (), rate_tokens: Sequence[tuple[int, int]] = (),
) -> tuple[object, ...]:
    """Parameters of claim_batch.sql (shared by the sync and async queue functions);
    `capped` is what lock_capped_destinations.sql returned in the same transaction, and
    `rate_tokens` the (destination id, tokens) rows of take_rate_tokens.sql."""
    return (
        worker, limit, first_attempt_reserve, lease_ms, capped, list(skip_destinations),
        [destination for destination, _ in rate_tokens], [n for _, n in rate_tokens],
    )


def rate_token_params(limit: int, skip_destinations: Sequence[int] = ()) -> tuple[object, ...]:
    """Parameters of take_rate_tokens.sql."""
    return (limit, list(skip_destinations))


def record_params(
    worker: str, results: Sequence[Result], breaker: BreakerSettings | None = None
) -> tuple[object, ...]:
    """Parameters of record_results.sql: the whole batch as one JSON document."""
    breaker = breaker or BreakerSettings()
    for r in results:
        if r.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {r.outcome!r}")
    return (
        worker,
        _RESULTS_ENCODER.encode(results).decode(),
        breaker.threshold,
        breaker.base_pause_ms,
        breaker.max_pause_ms,
        BREAKER_LOCK_CLASS,
        queries.NOTIFY_CHANNEL,
    )


def return_params(
    worker: str | None, only_expired: bool, reason: str, max_attempts: int
) -> tuple[object, ...]:
    """Parameters of return_claims.sql for one batch of at most RETURN_BATCH claims."""
    return (worker, only_expired, reason, max_attempts, RETURN_BATCH, BREAKER_LOCK_CLASS)


def claim_batch(
    conn: Connection, worker: str, limit: int, lease_ms: int, first_attempt_reserve: int = 0,
    skip_destinations: Sequence[int] = (),
) -> list[Claim]:
    """Claim up to `limit` due deliveries for `worker`, none of `skip_destinations`;
    commits before returning."""
    with conn.transaction():
        # Two statements: the claim's snapshot must be taken after the capped
        # destinations' locks (see lock_capped_destinations.sql).
        capped = [row[0] for row in _run(
            conn, queries.LOCK_CAPPED_DESTINATIONS, (CAPPED_CLAIM_LOCK_CLASS,)
        ).fetchall()]
        tokens = _run(
            conn, queries.TAKE_RATE_TOKENS, rate_token_params(limit, skip_destinations)
        ).fetchall()
        params = claim_params(
            worker, limit, lease_ms, first_attempt_reserve, capped, skip_destinations, tokens
        )
        rows = _run(conn, queries.CLAIM_BATCH, params).fetchall()
    return [Claim(*row) for row in rows]


def record_results(
    conn: Connection, worker: str, results: Sequence[Result],
    breaker: BreakerSettings | None = None,
) -> int:
    """Apply many attempt outcomes in one statement; returns how many still belonged to
    `worker` (the rest were reaped or released meanwhile and change nothing)."""
    if not results:
        return 0
    params = record_params(worker, results, breaker)
    with conn.transaction():
        row = _run(conn, queries.RECORD_RESULTS, params).fetchone()
    return int(row[0]) if row else 0


def release_claims(conn: Connection, worker: str, max_attempts: int) -> int:
    """Return every claim of `worker` (a process that died) to pending at once."""
    return _return_claims(conn, worker, False, "worker exited", max_attempts)


def reap_expired(conn: Connection, max_attempts: int) -> int:
    """Return claims whose lease ran out (a lost host) to pending."""
    return _return_claims(conn, None, True, "lease expired", max_attempts)


def _return_claims(
    conn: Connection, worker: str | None, only_expired: bool, reason: str, max_attempts: int
) -> int:
    total = 0
    params = return_params(worker, only_expired, reason, max_attempts)
    while True:
        with conn.transaction():
            row = _run(conn, queries.RETURN_CLAIMS, params).fetchone()
        moved = int(row[0]) + int(row[1]) if row else 0
        total += moved
        if moved < RETURN_BATCH:
            return total


def replay_delivery(conn: Connection, delivery_id: int) -> bool:
    """Put one delivery back as a first attempt; False if it is in flight or unknown."""
    with conn.transaction():
        row = _run(conn, queries.REPLAY_DELIVERY, (delivery_id,)).fetchone()
    return row is not None


def replay_dead(
    conn: Connection, destination_id: int, since: dt.datetime | None = None,
    batch: int = REPLAY_BATCH,
) -> int:
    """Replay every dead delivery of a destination (since a time) in bounded batches."""
    with conn.transaction():
        started = conn.execute("SELECT now()").fetchone()
    until = started[0] if started else None
    total = 0
    while True:
        with conn.transaction():
            row = _run(conn, queries.REPLAY_DEAD, (destination_id, since, until, batch))
            moved = int(row.fetchone()[0])
        total += moved
        if moved < batch:
            return total


def _enqueue_params(events: Sequence[EventIn]) -> tuple[list[object], ...]:
    target_ord: list[int] = []
    target_dest: list[int] = []
    for position, event in enumerate(events, start=1):
        for destination_id in event.destination_ids or ():
            target_ord.append(position)
            target_dest.append(destination_id)
    return (
        [e.type for e in events],
        [e.payload for e in events],
        [e.ordering_key for e in events],
        [e.idempotency_key for e in events],
        [e.request_hash for e in events],
        [e.destination_ids is not None for e in events],
        target_ord,
        target_dest,
    )


def _enqueue_answers(rows: Sequence[tuple]) -> list[tuple[int | None, int]]:
    return [(row[1], int(row[2]) if row[2] is not None else 0) for row in rows]


def enqueue_events(conn: Connection, events: Sequence[EventIn]) -> list[tuple[int | None, int]]:
    """Insert events and their deliveries in one statement, inside the caller's transaction.
    Returns (event id, delivery count) per event; id None where the idempotency key exists."""
    rows = _run(conn, queries.ENQUEUE_EVENTS, _enqueue_params(events)).fetchall()
    return _enqueue_answers(rows)


async def enqueue_events_async(
    conn: AsyncConnection, events: Sequence[EventIn]
) -> list[tuple[int | None, int]]:
    """`enqueue_events` on an asyncio connection. In autocommit the statement is its own
    transaction: one round trip, committed when it returns."""
    cursor = await _run_async(conn, queries.ENQUEUE_EVENTS, _enqueue_params(events))
    return _enqueue_answers(await cursor.fetchall())


async def replay_delivery_async(conn: AsyncConnection, delivery_id: int) -> bool:
    """`replay_delivery` on an asyncio connection."""
    async with conn.transaction():
        cursor = await _run_async(conn, queries.REPLAY_DELIVERY, (delivery_id,))
        row = await cursor.fetchone()
    return row is not None


async def replay_dead_async(
    conn: AsyncConnection, destination_id: int, since: dt.datetime | None = None,
    batch: int = REPLAY_BATCH,
) -> int:
    """`replay_dead` on an asyncio connection: bounded batches, each its own transaction."""
    async with conn.transaction():
        cursor = await conn.execute("SELECT now()")
        started = await cursor.fetchone()
    until = started[0] if started else None
    total = 0
    while True:
        async with conn.transaction():
            cursor = await _run_async(
                conn, queries.REPLAY_DEAD, (destination_id, since, until, batch)
            )
            row = await cursor.fetchone()
        moved = int(row[0]) if row else 0
        total += moved
        if moved < batch:
            return total

"""The queue operations a delivery worker needs, on an async psycopg connection.

Same SQL files and the same parameter building as engine/queue.py (only the I/O differs),
so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from psycopg import AsyncConnection

from engine import queries
from engine.database import run_statement_async
from engine.domain import BreakerSettings, Claim, Result
from engine.queue import (
    CAPPED_LOCKS_PER_CLAIM,
    claim_params,
    claims_from_rows,
    lock_capped_params,
    rate_token_params,
    record_params,
    refill_params,
)

_NOTIFY = f"NOTIFY {queries.NOTIFY_CHANNEL}".encode()


class ClaimedBatch(NamedTuple):
    claims: list[Claim]
    # The claim locked CAPPED_LOCKS_PER_CLAIM capped destinations, its most: others may
    # have room and due work too. Unless it claimed nothing, every claimer is notified
    # after its commit, this one included.
    # Claiming again at once instead, the worker that found a backlog of capped
    # destinations first took all of them, and the slot refill (refill_slots.sql) kept
    # them with it: in bench capped-slow one of two workers did all the work.
    capped_locks_full: bool


async def claim_batch(
    conn: AsyncConnection, worker: str, limit: int, lease_ms: int, first_attempt_reserve: int = 0,
    skip_destinations: Sequence[int] = (), announce_backlog: bool = False,
) -> ClaimedBatch:
    """Claim up to `limit` due deliveries for `worker`, none of `skip_destinations`;
    commits before returning. `announce_backlog`: nobody announced this work (the claim
    follows a poll, not a NOTIFY), so if the claim comes back full, wake every claimer.

    Pipelined: BEGIN goes out with the first statement and COMMIT with the claim, two
    round trips instead of four. On a busy machine every round trip waits for the backend
    to be scheduled, and the claim is what a worker's free slots wait for."""
    async with conn.pipeline() as pipeline, conn.transaction():
        # Two statements, as in queue.claim_batch: the capped destinations' locks first.
        cursor = await run_statement_async(
            conn, queries.LOCK_CAPPED_DESTINATIONS, lock_capped_params()
        )
        # Rate-limit tokens in the same round trip (take_rate_tokens.sql).
        tokens_cursor = await run_statement_async(
            conn, queries.TAKE_RATE_TOKENS, rate_token_params(limit, skip_destinations)
        )
        await pipeline.sync()
        capped = [row[0] for row in await cursor.fetchall()]
        tokens = await tokens_cursor.fetchall()
        params = claim_params(
            worker, limit, lease_ms, first_attempt_reserve, capped, skip_destinations, tokens
        )
        claimed = await run_statement_async(conn, queries.CLAIM_BATCH, params)
    claims = claims_from_rows(await claimed.fetchall(), tokens)
    capped_locks_full = len(capped) >= CAPPED_LOCKS_PER_CLAIM
    if (capped_locks_full and claims) or (announce_backlog and len(claims) >= limit):
        # Other capped destinations may have room: wake every claimer so that they share
        # them (see ClaimedBatch). Not after an empty claim: the destinations it locked
        # may all be left out, and every claimer would only lock them again.
        # A full claim after a poll found a backlog that fell due by time (retries, a
        # delay), which no NOTIFY announced: the idle claimers would each find it only at
        # their own poll, up to POLL_INTERVAL_S later. In bench drain-slow (10,000
        # deliveries falling due at once) the second worker joined up to a second late,
        # in a drain that lasts 1.2-1.4 s.
        await conn.execute(_NOTIFY)
    return ClaimedBatch(claims, capped_locks_full)


async def record_results(
    conn: AsyncConnection, worker: str, results: Sequence[Result],
    breaker: BreakerSettings | None = None,
) -> int:
    """Apply many attempt outcomes in one statement; returns how many still belonged to
    `worker`. `conn` is in autocommit mode: the one statement is its own transaction
    (no BEGIN and COMMIT round trips around it)."""
    if not results:
        return 0
    params = record_params(worker, results, breaker)
    row = await (await run_statement_async(conn, queries.RECORD_RESULTS, params)).fetchone()
    return int(row[0]) if row else 0


async def record_results_and_refill(
    conn: AsyncConnection, worker: str, results: Sequence[Result], lease_ms: int,
    refill: Mapping[int, int], breaker: BreakerSettings | None = None,
    spares: Mapping[int, int] = {},
) -> list[Claim]:
    """queue.record_results_and_refill on an async connection, in autocommit mode.
    Pipelined, without BEGIN and COMMIT: in a pipeline, the statements up to its Sync
    are one transaction (PostgreSQL's extended protocol), which commits at the Sync and
    rolls back whole if one fails. Every statement psycopg sends waits for one turn of
    the worker's event loop, busy with HTTP; BEGIN and COMMIT were two more turns of
    the write that a freed capped slot waits for (bench capped-slow, stock PostgreSQL
    15: 3 of 4 pairs faster, medians 4,314 against 4,165/s, 2026-12-03)."""
    record = record_params(worker, results, breaker, list(refill))
    refills = refill_params(worker, lease_ms, refill, spares)
    async with conn.pipeline():
        await run_statement_async(conn, queries.RECORD_RESULTS, record)
        refilled = await run_statement_async(conn, queries.REFILL_SLOTS, refills)
    return claims_from_rows(await refilled.fetchall(), ())

"""The queue operations a delivery worker needs, on an async psycopg connection.

Same SQL files and the same parameter building as engine/queue.py (only the I/O differs),
so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import AsyncConnection

from engine import queries
from engine.database import run_statement_async
from engine.domain import BreakerSettings, Claim, Result
from engine.queue import (
    claim_params,
    claims_from_rows,
    lock_capped_params,
    rate_token_params,
    record_params,
)


async def claim_batch(
    conn: AsyncConnection, worker: str, limit: int, lease_ms: int, first_attempt_reserve: int = 0,
    skip_destinations: Sequence[int] = (),
) -> list[Claim]:
    """Claim up to `limit` due deliveries for `worker`, none of `skip_destinations`;
    commits before returning.

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
    return claims_from_rows(await claimed.fetchall(), tokens)


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

"""take_rate_tokens.sql with the `rated` part of claim_batch.sql, against a real database:
what claimers take from one destination's bucket, alone or three at once on their own
connections (the sync and the pipelined async claim), keeps to the rate."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg

from engine import queue, queue_async
from tests.kit.data import add_destination, enqueue

RATE = 20.0
SECONDS = 2.5


def backlog(conn: psycopg.Connection) -> int:
    dest = add_destination(conn, rate_limit=RATE)
    enqueue(conn, [f'{{"n": {i}}}' for i in range(500)], [dest])
    return dest


def assert_within_rate(total: int) -> None:
    # The bucket starts empty and holds at most one second's worth.
    assert total <= RATE * SECONDS + RATE
    # Claiming in a loop, nothing is lost but what the last claim had not yet taken.
    assert total >= 0.9 * RATE * SECONDS - 1


def test_one_claimer_takes_the_rate(conn: psycopg.Connection) -> None:
    backlog(conn)
    started = time.monotonic()
    total = 0
    while time.monotonic() - started < SECONDS:
        total += len(queue.claim_batch(conn, "w:1", 100, 60_000))
        time.sleep(0.02)
    assert_within_rate(total)


def test_concurrent_claimers_share_one_bucket(conn: psycopg.Connection, dsn: str) -> None:
    backlog(conn)
    taken: list[int] = []
    started = time.monotonic()

    def claimer(name: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            while time.monotonic() - started < SECONDS:
                taken.append(len(queue.claim_batch(own, name, 100, 60_000)))

    threads = [threading.Thread(target=claimer, args=(f"w:{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert_within_rate(sum(taken))


def test_concurrent_pipelined_claimers_share_one_bucket(
    conn: psycopg.Connection, dsn: str
) -> None:
    backlog(conn)
    taken: list[int] = []
    started = time.monotonic()

    async def claimer(name: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as own:
            while time.monotonic() - started < SECONDS:
                taken.append(len(await queue_async.claim_batch(own, name, 100, 60_000)))

    async def main() -> None:
        await asyncio.gather(*(claimer(f"w:{i}") for i in range(3)))

    asyncio.run(main())
    assert_within_rate(sum(taken))


def test_unused_tokens_go_back_to_the_bucket(conn: psycopg.Connection) -> None:
    dest = add_destination(conn, rate_limit=1000.0)
    enqueue(conn, ['{"n": 1}', '{"n": 2}'], [dest])
    queue.claim_batch(conn, "w:1", 100, 60_000)  # starts the bucket's clock
    time.sleep(0.5)
    claims = queue.claim_batch(conn, "w:1", 100, 60_000)
    assert len(claims) == 2
    row = conn.execute("SELECT rate_tokens FROM destinations WHERE id = %s", [dest]).fetchone()
    assert row is not None
    # About 500 tokens had accrued; 100 were taken (the claim's limit) and 98 came back.
    assert 300 < row[0] < 1000

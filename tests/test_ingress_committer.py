"""The group committer on its own: requests share commits, one bad request cannot fail the
others, a repeated key is answered from the first event, overload is refused."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest

from engine.db.queries import NOTIFY_CHANNEL
from engine.db.queue import EventIn
from engine.ingress import committer as committer_module
from engine.ingress.committer import Committer
from engine.ingress.errors import ApiError

T = TypeVar("T")


def add_destination(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "INSERT INTO destinations (url, secret) VALUES ('http://127.0.0.1:9/', 'whsec_AAAA')"
        " RETURNING id"
    ).fetchone()
    assert row is not None
    return int(row[0])


async def run_with(committer: Committer, work: Callable[[], Awaitable[T]]) -> T:
    committer.start()
    try:
        return await work()
    finally:
        await committer.stop()


def test_concurrent_requests_share_commits(dsn: str, conn: psycopg.Connection) -> None:
    add_destination(conn)
    add_destination(conn)
    committer = Committer(dsn)
    commits: list[int] = []
    committer.on_commit.append(lambda requests, events, seconds: commits.append(requests))

    async def work() -> Any:
        return await asyncio.gather(
            *(committer.submit([EventIn("t", f'{{"n": {i}}}')]) for i in range(50))
        )

    answers = asyncio.run(run_with(committer, work))
    assert [a[0].deliveries for a in answers] == [2] * 50
    assert len({a[0].id for a in answers}) == 50
    assert sum(commits) == 50
    assert len(commits) <= 2  # arrived together: one commit (two slots at most)
    row = conn.execute("SELECT count(*) FROM deliveries").fetchone()
    assert row == (100,)


def test_requests_arriving_during_a_commit_go_together_in_the_next(
    dsn: str, conn: psycopg.Connection
) -> None:
    """Natural batching: a lone request is committed at once; those arriving while it
    commits wait for it and share the next commit."""
    add_destination(conn)
    committer = Committer(dsn)
    commits: list[int] = []
    committer.on_commit.append(lambda requests, events, seconds: commits.append(requests))

    async def work() -> Any:
        first = asyncio.ensure_future(committer.submit([EventIn("t", "0")]))
        while not committer._committing:  # the first commit is on its way
            await asyncio.sleep(0)
        rest = await asyncio.gather(*(committer.submit([EventIn("t", "1")]) for _ in range(20)))
        return [await first, *rest]

    answers = asyncio.run(run_with(committer, work))
    assert len({a[0].id for a in answers}) == 21
    assert commits == [1, 20]


def test_one_bad_request_does_not_fail_the_others(dsn: str, conn: psycopg.Connection) -> None:
    add_destination(conn)
    committer = Committer(dsn)

    async def work() -> Any:
        # A NUL byte in a text column: refused by PostgreSQL (validation stops this
        # before the committer; here it stands for any request the database refuses).
        return await asyncio.gather(
            committer.submit([EventIn("good", "1")]),
            committer.submit([EventIn("bad\x00", "2")]),
            committer.submit([EventIn("good", "3")]),
            return_exceptions=True,
        )

    first, bad, third = asyncio.run(run_with(committer, work))
    assert isinstance(bad, ApiError) and bad.status == 422
    assert not isinstance(first, BaseException) and not isinstance(third, BaseException)
    rows = conn.execute("SELECT payload FROM events ORDER BY id").fetchall()
    assert rows == [("1",), ("3",)]


def test_key_conflict_in_a_multi_event_request_writes_none_of_it(
    dsn: str, conn: psycopg.Connection
) -> None:
    add_destination(conn)
    committer = Committer(dsn)

    async def work() -> Any:
        await committer.submit([EventIn("t", "1", idempotency_key="k", request_hash=b"a")])
        return await asyncio.gather(
            committer.submit([
                EventIn("t", "2"),
                EventIn("t", "3", idempotency_key="k", request_hash=b"different"),
            ]),
            committer.submit([EventIn("t", "4")]),
            committer.submit([EventIn("t", "1", idempotency_key="k", request_hash=b"a")]),
            return_exceptions=True,
        )

    conflicted, fine, repeat = asyncio.run(run_with(committer, work))
    assert isinstance(conflicted, ApiError) and conflicted.status == 409
    assert not isinstance(fine, BaseException)
    assert not isinstance(repeat, BaseException)
    rows = conn.execute("SELECT id, payload FROM events ORDER BY id").fetchall()
    assert [payload for _, payload in rows] == ["1", "4"]
    assert repeat[0].id == rows[0][0]


def test_overload_is_refused_not_queued(dsn: str) -> None:
    committer = Committer(dsn, max_waiting_events=10, window_s=0.05)

    async def work() -> Any:
        return await asyncio.gather(
            *(committer.submit([EventIn("t", "1")] * 4) for _ in range(5)),
            return_exceptions=True,
        )

    answers = asyncio.run(run_with(committer, work))
    refused = [a for a in answers if isinstance(a, ApiError)]
    assert refused and all(a.status == 503 for a in refused)
    assert len(refused) < len(answers)


@pytest.mark.parametrize("window_s", [0.0, 0.002])
def test_answers_come_only_after_the_commit(dsn: str, window_s: float) -> None:
    committer = Committer(dsn, window_s=window_s)

    async def work() -> Any:
        [accepted] = await committer.submit([EventIn("t", "1")])
        # Another connection sees the event the moment the answer exists.
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            cursor = await other.execute("SELECT id FROM events")
            return accepted.id, await cursor.fetchall()

    event_id, rows = asyncio.run(run_with(committer, work))
    assert rows == [(event_id,)]


def test_commits_wake_the_workers_with_a_debounced_notify(
    dsn: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most one NOTIFY per interval, and one after the last commit. The interval is
    stretched from 5 ms so that the bound below means something however slowly a loaded
    machine commits: a slower machine only loosens it, it cannot break it."""
    interval = 0.25
    monkeypatch.setattr(committer_module, "NOTIFY_INTERVAL_S", interval)
    add_destination(conn)
    committer = Committer(dsn, window_s=0)

    async def work() -> tuple[int, float, float]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
            await listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
            loop = asyncio.get_running_loop()
            started = loop.time()
            for i in range(20):  # 20 commits in quick succession
                await committer.submit([EventIn("t", str(i))])
            committed = loop.time()
            received, last = 0, 0.0
            # Until the notifier has been quiet for a few intervals: the one it owes the
            # last commit comes within one.
            while [n async for n in listener.notifies(timeout=4 * interval, stop_after=1)]:
                received, last = received + 1, loop.time()
            return received, committed - started, last - committed

    notifications, took, last_after_commits = asyncio.run(run_with(committer, work))
    assert 1 <= notifications <= min(20, 2 + int(took / interval)), (notifications, took)
    assert last_after_commits > 0  # the last one came after the last commit

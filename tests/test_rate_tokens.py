"""take_rate_tokens.sql with the `rated` part of claim_batch.sql, against a real database:
the send times claimers book for one destination, alone or three at once on their own
connections (the sync and the pipelined async claim), are never closer than 1/rate, none
is left unbooked while claims keep coming, and what a claim cannot use goes back, capped
or not. A property test on a frozen database clock checks the same for any sequence of
backlogs, claim sizes and pauses."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import threading
import time

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.db import queue_async
from engine.db.queue import Claim
from tests.kit import queue_sync
from tests.kit.data import add_destination, enqueue
from tests.kit.dbserver import truncate_all

pytestmark = pytest.mark.pg_versions

RATE = 20.0
SECONDS = 2.5
BOOKED_AHEAD_S = 1.0  # take_rate_tokens.sql books up to a second ahead
# timestamptz and timedelta count microseconds: each send time may be rounded by one.
ROUNDING_S = 2e-6


def backlog(conn: psycopg.Connection) -> int:
    dest = add_destination(conn, rate_limit=RATE)
    enqueue(conn, [f'{{"n": {i}}}' for i in range(500)], [dest])
    return dest


def send_times(claims: list[Claim]) -> list[dt.datetime]:
    times = [claim.send_at for claim in claims]
    assert None not in times, "a rate-limited claim without a send time"
    return sorted(times)  # type: ignore[type-var]


def assert_within_rate(claims: list[Claim]) -> None:
    times = send_times(claims)
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(times)]
    # The bound itself: no two sends closer than 1/rate, whoever booked them.
    assert min(gaps) >= 1 / RATE - ROUNDING_S, min(gaps)
    # None booked further ahead than a second (and a send time is never in the past).
    delays = [claim.send_delay_s for claim in claims]
    assert min(delays) >= 0, min(delays)
    assert max(delays) <= BOOKED_AHEAD_S + 1 / RATE, max(delays)
    assert len(claims) <= RATE * (SECONDS + BOOKED_AHEAD_S) + 1
    # Claiming in a loop, the limit is used: the send times of the claiming period are
    # (nearly) all booked.
    period_end = times[0] + dt.timedelta(seconds=SECONDS)
    assert sum(1 for t in times if t < period_end) >= 0.9 * RATE * SECONDS


def test_one_claimer_takes_the_rate(conn: psycopg.Connection) -> None:
    backlog(conn)
    started = time.monotonic()
    claims: list[Claim] = []
    while time.monotonic() - started < SECONDS:
        claims += queue_sync.claim_batch(conn, "w:1", 100, 60_000)
        time.sleep(0.02)
    assert_within_rate(claims)


def test_concurrent_claimers_share_one_schedule(conn: psycopg.Connection, dsn: str) -> None:
    backlog(conn)
    claims: list[Claim] = []
    started = time.monotonic()

    def claimer(name: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            while time.monotonic() - started < SECONDS:
                claims.extend(queue_sync.claim_batch(own, name, 100, 60_000))

    threads = [threading.Thread(target=claimer, args=(f"w:{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert_within_rate(claims)


def test_concurrent_pipelined_claimers_share_one_schedule(
    conn: psycopg.Connection, dsn: str
) -> None:
    backlog(conn)
    claims: list[Claim] = []
    started = time.monotonic()

    async def claimer(name: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as own:
            while time.monotonic() - started < SECONDS:
                claims.extend(await queue_async.claim_batch(own, name, 100, 60_000))

    async def main() -> None:
        await asyncio.gather(*(claimer(f"w:{i}") for i in range(3)))

    asyncio.run(main())
    assert_within_rate(claims)


@pytest.mark.parametrize("max_in_flight", [None, 50])
def test_unused_send_times_go_back(conn: psycopg.Connection, max_in_flight: int | None) -> None:
    dest = add_destination(conn, rate_limit=1000.0, max_in_flight=max_in_flight)
    enqueue(conn, ['{"n": 1}', '{"n": 2}'], [dest])
    claims = queue_sync.claim_batch(conn, "w:1", 100, 60_000)
    # A second's worth (the claim's limit of 100) was booked, two were used.
    assert len(claims) == 2
    first, second = send_times(claims)
    assert abs((second - first).total_seconds() - 0.001) <= ROUNDING_S
    row = conn.execute("SELECT rate_next_send_at, in_flight FROM destinations WHERE id = %s",
                       [dest]).fetchone()
    assert row is not None
    next_send_at, in_flight = row
    assert abs((next_send_at - second).total_seconds() - 0.001) <= ROUNDING_S
    # A capped one's slots are taken by the same update.
    assert in_flight == (0 if max_in_flight is None else 2)


@pytest.mark.parametrize("max_in_flight", [None, 100])
def test_a_claim_that_finds_little_leaves_the_rest_to_the_next(
    conn: psycopg.Connection, max_in_flight: int | None
) -> None:
    """With a cap too: its row is updated once by the claim, for its slots and its unused
    send times together. (Before, a capped destination's unused tokens were lost, and a
    claim just after one that found a single delivery got nothing.)"""
    dest = add_destination(conn, rate_limit=10.0, max_in_flight=max_in_flight)
    enqueue(conn, ['{"n": 0}'], [dest])
    claimed = len(queue_sync.claim_batch(conn, "w:1", 100, 60_000))
    # Idle for longer than a second: what may be sent at once is as much as it can be.
    time.sleep(1.1)
    enqueue(conn, ['{"n": 1}'], [dest])
    claimed += len(queue_sync.claim_batch(conn, "w:1", 100, 60_000))
    enqueue(conn, [f'{{"n": {i}}}' for i in range(2, 7)], [dest])
    claimed += len(queue_sync.claim_batch(conn, "w:1", 100, 60_000))
    assert claimed == 7
    row = conn.execute("SELECT in_flight FROM destinations WHERE id = %s", [dest]).fetchone()
    assert row == ((0 if max_in_flight is None else 7),)


# The database clock, frozen and moved by the test (as in tests/test_claim_properties.py),
# statement_timestamp() too: take_rate_tokens.sql books from it.
CLOCK_START = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)
FROZEN_CLOCK = (
    "CREATE SCHEMA IF NOT EXISTS testclock",
    *(f"CREATE OR REPLACE FUNCTION testclock.{name}() RETURNS timestamptz LANGUAGE sql"
      f" {volatility} AS $$ SELECT current_setting('testclock.now')::timestamptz $$"
      for name, volatility in (("now", "STABLE"), ("statement_timestamp", "STABLE"),
                               ("clock_timestamp", "VOLATILE"))),
    "SET search_path = testclock, pg_catalog, public",
)
# (ms the clock moves, deliveries enqueued, the claim's limit)
STEPS = st.lists(st.tuples(st.integers(0, 1500), st.integers(0, 40), st.integers(1, 60)),
                 min_size=1, max_size=10)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rate=st.sampled_from([0.5, 3.0, 20.0, 1000.0]), capped=st.booleans(), steps=STEPS)
def test_booked_send_times_keep_the_rate_and_use_it(
    dsn: str, rate: float, capped: bool, steps: list[tuple[int, int, int]]
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        truncate_all(conn)
        for statement in FROZEN_CLOCK:
            queue_sync.execute(conn, statement)
        dest = add_destination(conn, rate_limit=rate, max_in_flight=1000 if capped else None)
        clock = CLOCK_START
        pending = claimed = 0
        booked: list[dt.datetime] = []
        for advance_ms, new, limit in steps:
            clock += dt.timedelta(milliseconds=advance_ms)
            queue_sync.execute(conn, "SELECT set_config('testclock.now', %s, false)",
                               [clock.isoformat()])
            enqueue(conn, [f'{{"n": {i}}}' for i in range(new)], [dest])
            pending += new
            claims = queue_sync.claim_batch(conn, "w:1", limit, 60_000)
            pending -= len(claims)
            claimed += len(claims)
            row = conn.execute("SELECT rate_next_send_at, in_flight FROM destinations"
                               " WHERE id = %s", [dest]).fetchone()
            assert row is not None
            next_send_at, in_flight = row
            assert in_flight == (claimed if capped else 0)
            times = send_times(claims)
            if times:
                # Booked from now, at most a second ahead; the next send after the last.
                assert times[0] >= clock
                assert times[-1] <= clock + dt.timedelta(seconds=1, microseconds=2)
                assert abs((next_send_at - times[-1]).total_seconds() - 1 / rate) <= ROUNDING_S
            if len(claims) < limit and pending > 0:
                # Backlog left behind: the claim booked all it could, up to a second ahead.
                assert next_send_at > clock + dt.timedelta(seconds=1 - 1 / rate - ROUNDING_S)
            booked += times
        booked.sort()
        gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(booked)]
        assert not gaps or min(gaps) >= 1 / rate - ROUNDING_S, min(gaps)

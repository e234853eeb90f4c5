"""engine/worker/outcome.py on its own: an HTTP result into a Result with its retry time.
No worker, database or HTTP: the function is pure given its clock and random source."""

from __future__ import annotations

import datetime as dt
import random
import time

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from engine.config import load_settings
from engine.domain import Claim, Result
from engine.webhooks.retry import JITTER
from engine.worker import outcome as outcomes
from engine.worker.http.client import HttpResult
from engine.worker.outcome import MAX_RETRY_AFTER_S, STORED_BODY_BYTES


def test_outcome_mapping_bounds_retry_after_and_stored_bodies() -> None:
    settings = load_settings(retry_schedule="1s,2s")
    claim = Claim(1, 7, 1, 1, "http://127.0.0.1/", 1000, [], "{}")
    started = time.time()

    def outcome(status: int | None, body: bytes = b"", error: str | None = None,
                retry_after: float | None = None, attempt: int = 1) -> Result:
        response = HttpResult(status, body, error, 5.0, retry_after, started)
        return outcomes.response_result(
            msgspec.structs.replace(claim, attempt=attempt), response, settings.retry_schedule)

    assert outcome(204).outcome == "delivered"
    stored = outcome(500, b"a\x00b" + b"x" * 10_000)
    assert stored.outcome == "retry" and stored.error == "HTTP 500"
    # Cut to its first 4096 bytes, the NUL (which PostgreSQL text cannot hold) replaced.
    assert stored.body == "a\ufffdb" + "x" * 4093
    assert outcome(410).outcome == "gone"
    assert outcome(None, error="timeout").error == "timeout"
    assert outcome(500, attempt=3).outcome == "dead"  # 1 + two retries
    now = dt.datetime.now(dt.UTC)
    honoured = outcome(429, retry_after=120).next_attempt_at
    bounded = outcome(503, retry_after=10**9).next_attempt_at
    ignored = outcome(500, retry_after=120).next_attempt_at  # only 429/503 carry it
    assert honoured is not None and bounded is not None and ignored is not None
    assert dt.timedelta(seconds=119) < honoured - now < dt.timedelta(seconds=125)
    assert dt.timedelta(minutes=59) < bounded - now <= dt.timedelta(hours=1, seconds=5)
    assert ignored - now < dt.timedelta(seconds=5)


NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
DEFAULT_SCHEDULE = (1.0, 2.0, 4.0)

schedules = st.lists(st.floats(0.001, 10_000), min_size=1, max_size=6).map(sorted)
claims = st.builds(
    Claim, id=st.integers(1, 2**62), event_id=st.integers(1, 2**62),
    destination_id=st.integers(1, 2**31), attempt=st.integers(1, 12),
    url=st.just("http://127.0.0.1/"), timeout_ms=st.integers(1, 60_000),
    secrets=st.just([]), payload=st.just("{}"),
    retry_schedule=st.none() | schedules, claim_token=st.none() | st.integers(1, 2**62),
)
responses = st.builds(
    HttpResult, status_code=st.none() | st.integers(100, 599), body=st.binary(max_size=5000),
    error=st.none() | st.sampled_from(["timeout", "connect refused", "body too large"]),
    duration_ms=st.floats(0, 120_000), retry_after=st.none() | st.floats(0, 10**9),
    started_at=st.floats(1.7e9, 1.9e9),
)


@given(claims, responses, st.integers(0, 2**32))
def test_every_response_maps_to_one_consistent_result(
    claim: Claim, response: HttpResult, seed: int
) -> None:
    result = outcomes.response_result(
        claim, response, DEFAULT_SCHEDULE, now=lambda: NOW, rng=random.Random(seed))
    schedule = claim.retry_schedule or DEFAULT_SCHEDULE
    # The claim's identity and token travel with its result.
    assert (result.id, result.attempt, result.claim_token) == (
        claim.id, claim.attempt, claim.claim_token)
    assert result.status_code == response.status_code
    assert result.started_at == dt.datetime.fromtimestamp(response.started_at, dt.UTC)
    # A stored body fits a text column: bounded and without NUL.
    if result.body is not None:
        assert "\x00" not in result.body and len(result.body) <= STORED_BODY_BYTES
    else:
        assert not response.body
    if response.ok:
        assert result.outcome == "delivered"
        assert result.next_attempt_at is None and result.error is None
        return
    assert result.error
    if response.status_code == 410 and response.error is None:
        # Gone: waits for its destination, however many attempts are left.
        assert result.outcome == "gone" and result.next_attempt_at is not None
        return
    if claim.attempt > len(schedule):
        assert result.outcome == "dead" and result.next_attempt_at is None
        return
    assert result.outcome == "retry" and result.next_attempt_at is not None
    delay = (result.next_attempt_at - NOW).total_seconds()
    base = schedule[claim.attempt - 1]
    low, high = base * (1 - JITTER), base * (1 + JITTER)
    honoured = response.status_code in (429, 503) and response.retry_after is not None
    if honoured:
        assert response.retry_after is not None
        # Retry-After lengthens the wait, up to an hour; it never shortens the schedule.
        bound = min(response.retry_after, MAX_RETRY_AFTER_S)
        assert delay >= low - 1e-5 and delay <= max(high, bound) + 1e-5
        assert delay >= bound - 1e-5
    else:
        assert low - 1e-5 <= delay <= high + 1e-5


@given(claims)
def test_attempts_used_up_exactly_past_the_schedule(claim: Claim) -> None:
    schedule = claim.retry_schedule or DEFAULT_SCHEDULE
    used_up = outcomes.attempts_used_up(claim, DEFAULT_SCHEDULE)
    assert used_up == (claim.attempt > len(schedule) + 1)
    dead = outcomes.exhausted(claim, now=lambda: NOW)
    assert (dead.outcome, dead.error, dead.started_at) == ("dead", outcomes.EXHAUSTED, NOW)
    released = outcomes.released(claim, now=lambda: NOW)
    assert released.outcome == "released" and released.claim_token == claim.claim_token

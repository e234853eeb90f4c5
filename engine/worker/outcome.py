"""What one attempt's HTTP result means: delivered, retry (and when), dead or gone.

Pure: the answer depends only on the claim, the response, the retry schedule, the clock
and the jitter's random source passed in, so it is tested on its own
(tests/test_outcome.py) without a worker, a database or HTTP.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Sequence

from engine.domain import Claim, Result
from engine.webhooks.retry import retry_delay
from engine.worker.http.client import HttpResult

MAX_RETRY_AFTER_S = 3600.0
STORED_BODY_BYTES = 4096
EXHAUSTED = "attempts exhausted"

Clock = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def schedule_for(claim: Claim, default: Sequence[float]) -> Sequence[float]:
    """The destination's own retry schedule as of this claim, else the engine's: a
    schedule changed meanwhile applies from the next failure on."""
    return claim.retry_schedule or default


def attempts_used_up(claim: Claim, default: Sequence[float]) -> bool:
    """Lost attempts (dead workers, expired leases) used the last one up: not to be sent."""
    return claim.attempt > len(schedule_for(claim, default)) + 1


def exhausted(claim: Claim, now: Clock = utcnow) -> Result:
    return Result(claim.id, claim.attempt, "dead", now(), error=EXHAUSTED,
                  claim_token=claim.claim_token)


def released(claim: Claim, now: Clock = utcnow) -> Result:
    """A claim given back unsent or unanswered: the attempt is undone."""
    return Result(claim.id, claim.attempt, "released", now(), claim_token=claim.claim_token)


def response_result(
    claim: Claim, response: HttpResult, default_schedule: Sequence[float], *,
    now: Clock = utcnow, rng: random.Random | None = None,
) -> Result:
    """The Result of an answered (or failed: timeout, refused...) request."""
    started = dt.datetime.fromtimestamp(response.started_at, dt.UTC)
    duration = int(response.duration_ms)
    status = response.status_code
    # PostgreSQL text cannot hold NUL: a body with one would fail the whole batch.
    body = (
        response.body[:STORED_BODY_BYTES].decode("utf-8", "replace").replace("\x00", "\ufffd")
        if response.body else None
    )
    if response.ok:
        return Result(claim.id, claim.attempt, "delivered", started, duration, status,
                      None, body, claim_token=claim.claim_token)
    if status == 410 and response.error is None:
        # The destination is disabled by record_results; the delivery waits for it.
        schedule = schedule_for(claim, default_schedule)
        delay = retry_delay(schedule, claim.attempt, rng) or schedule[-1]
        return Result(claim.id, claim.attempt, "gone", started, duration, status,
                      "HTTP 410", body, now() + dt.timedelta(seconds=delay),
                      claim.claim_token)
    retry_after = response.retry_after if status in (429, 503) else None
    return failure(
        claim, default_schedule, started, duration, status,
        response.error or f"HTTP {status}", body, retry_after, now=now, rng=rng,
    )


def failure(
    claim: Claim, default_schedule: Sequence[float], started: dt.datetime,
    duration: int | None, status: int | None, error: str, body: str | None = None,
    retry_after: float | None = None, *, now: Clock = utcnow,
    rng: random.Random | None = None,
) -> Result:
    """A failed attempt: retried after the schedule's delay (or the destination's
    Retry-After, bounded, if longer), dead after the last one."""
    delay = retry_delay(schedule_for(claim, default_schedule), claim.attempt, rng)
    if delay is None:
        return Result(claim.id, claim.attempt, "dead", started, duration, status, error, body,
                      claim_token=claim.claim_token)
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER_S))
    return Result(claim.id, claim.attempt, "retry", started, duration, status, error, body,
                  now() + dt.timedelta(seconds=delay), claim.claim_token)

"""The retry schedule: when a failed delivery is tried again, and when it is dead."""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Sequence

# The Standard Webhooks example schedule: delays after the first failed attempt.
DEFAULT_SCHEDULE: tuple[float, ...] = (
    5, 5 * 60, 30 * 60, 2 * 3600, 5 * 3600, 10 * 3600, 14 * 3600, 20 * 3600, 24 * 3600,
)
JITTER = 0.2

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'5s', '30m', '2h', '1d', '250ms' -> seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a duration (like 5s, 30m, 2h, 1d, 250ms): {text!r}")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def parse_schedule(text: str) -> tuple[float, ...]:
    """'5s,5m,30m' -> (5.0, 300.0, 1800.0); delays must be positive and non-decreasing."""
    delays = tuple(parse_duration(part) for part in text.split(",") if part.strip())
    if not delays:
        raise ValueError("the retry schedule needs at least one delay")
    if any(d <= 0 for d in delays):
        raise ValueError("retry delays must be positive")
    if any(b < a for a, b in itertools.pairwise(delays)):
        raise ValueError("retry delays must not decrease")
    return delays


def max_attempts(schedule: Sequence[float]) -> int:
    """The first attempt plus one per scheduled retry."""
    return len(schedule) + 1


def retry_delay(
    schedule: Sequence[float], attempt: int, rng: random.Random | None = None
) -> float | None:
    """Seconds until the next try after failed attempt number `attempt` (1-based), with
    ±20 % jitter so a burst of failures does not come back as a burst; None when that was
    the last attempt and the delivery is dead."""
    if attempt < 1:
        raise ValueError("attempts are numbered from 1")
    if attempt > len(schedule):
        return None
    base = schedule[attempt - 1]
    return base * (1 + (rng or random).uniform(-JITTER, JITTER))

"""Holds a worker's rate-limited claims until their booked send time.

take_rate_tokens.sql books each claimed delivery of a rate-limited destination a send time
1/rate after the previous one, and the claim may come back before that time: the worker
sends it no earlier. What the receiver sees is then spaced as booked, give or take each
send's lateness (see schema/012_rate_send_schedule.sql for why the claim alone was not
enough)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from engine.domain import Claim

# A claim due this soon is sent at once: a timer would not fire sooner (libuv's clock
# counts milliseconds), and a send this much early puts rate / 1000 more requests in a
# window, against a bound that leaves nearly a second's worth for lateness.
SEND_AT_ONCE_S = 0.001


class SendSchedule:
    """Claims waiting for their send time, earliest first, under one timer: the earliest's.
    `send(claim, since)` gets each when it is due; `since` is passed through (when the
    worker took the claim)."""

    __slots__ = ("_order", "_send", "_timer", "_timer_due", "_waiting")

    def __init__(self, send: Callable[[Claim, float], None]) -> None:
        self._send = send
        self._waiting: list[tuple[float, int, Claim, float]] = []  # (due, order, claim, since)
        self._order = itertools.count()  # ties in due time go in the order held
        # The timer and its due time, kept here: uvloop's call_at returns a plain Handle,
        # with no when(), for a time less than half a millisecond ahead (or past), which
        # _send_due reaches when its sends took a while (engine/worker/recorder.py).
        self._timer: asyncio.Handle | None = None
        self._timer_due = 0.0

    def __len__(self) -> int:
        return len(self._waiting)

    def hold(self, claim: Claim, since: float) -> None:
        """Send `claim` send_delay_s from now (the loop's clock)."""
        loop = asyncio.get_running_loop()
        due = loop.time() + claim.send_delay_s
        heapq.heappush(self._waiting, (due, next(self._order), claim, since))
        timer = self._timer
        if timer is None or due < self._timer_due:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(due, self._send_due)
            self._timer_due = due

    def take_all(self) -> list[Claim]:
        """Every claim still waiting (a draining worker releases them unsent)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        claims = [claim for _, _, claim, _ in self._waiting]
        self._waiting.clear()
        return claims

    def _send_due(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        waiting = self._waiting
        ready_by = loop.time() + SEND_AT_ONCE_S
        while waiting and waiting[0][0] <= ready_by:
            _, _, claim, since = heapq.heappop(waiting)
            self._send(claim, since)
        if waiting:
            self._timer_due = waiting[0][0]
            self._timer = loop.call_at(self._timer_due, self._send_due)

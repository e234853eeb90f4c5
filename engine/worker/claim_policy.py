"""How much one worker claims and when, and which destinations it leaves out.

The claim loop (loop.py) asks `ClaimPolicy.limit` before each claim and tells it what
the claim brought back (`claimed`); the sending side asks `room` after every answer, to
wake the claim loop once enough slots are free.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping

from engine.domain import Claim, Result
from engine.worker.outcome import utcnow
from engine.worker.slots import LEASE_SAFETY_MS, DestinationSlots

CLAIM_CAP = 500  # most rows one claim takes (docs/decisions/0003-claim-cap-500.md)
# While other tenants' work waits (a claim shared its room among tenants, within the last
# SHARED_HOLD_S), a claim takes at most this many: the claim after it, which takes the
# others' next due rows, comes that much sooner (a worker draining one tenant's backlog
# claims as fast as it sends, so a claim's size is the wait of every other tenant's
# delivery due meanwhile). One tenant's drain keeps CLAIM_CAP. Decision 0039.
SHARED_CLAIM_CAP = 200
SHARED_HOLD_S = 1.0
POLL_INTERVAL_S = 1.0  # fallback when no NOTIFY comes (retries falling due, missed ones)
# After a claim with rate-limited deliveries, the next claim comes within a token's time,
# bounded: often enough that the second of send times a claim books ahead never runs out
# (take_rate_tokens.sql).
RATE_RECHECK_MIN_S = 0.05
RATE_RECHECK_MAX_S = 0.5
# A destination that holds SLOW_SHARE of the slots while silent (no HTTP answer for
# slots.SLOW_REQUEST_S, or none yet: a dead endpoint hangs every request for its whole
# timeout) is left out of this process's claims: it cannot take the slots of healthy
# destinations before its breaker opens (which needs failures, which take a timeout to
# come). When a claim that left such destinations out comes back empty, nobody else is
# waiting, and the next claim takes them as well: a slow destination alone still gets
# every slot it needs. (Empty, not merely short: under a steady healthy load most claims
# are short, and a dead endpoint would get in again.) This and the three below:
# docs/decisions/0021-slow-and-silent-destinations-kept-to-a-share.md.
SLOW_SHARE = 1 / 8
# ...but only once the other destinations have had nothing to claim for this long. A
# steady trickle of healthy traffic has gaps, and a claim that found nothing in one of
# them handed every free slot to the slow endpoint for its whole response time. A slow
# destination alone waits at most this long for more slots than its share.
OTHERS_IDLE_S = 1.0
# A destination whose last answer took this long is slow (a 5 s endpoint holding many
# slots answers several times a second, so it is never silent): while it holds its share
# it is left out like a silent one, and a claim's deliveries beyond its share are given
# back at once instead of waiting seconds for its slots. Its backlog, piled up while it
# was left out, would otherwise fill every free slot the moment its share came back. Far
# above what a starved CPU adds to a fast endpoint's answers; a faster answer makes it
# normal again.
SLOW_ANSWER_S = 2.0
# Slow destinations together (those above, and those whose requests ran out their timeout
# unanswered) hold at most this share of the slots while others have work: fifty dead
# endpoints with one request each are as harmful as one with fifty.
SLOW_GROUP_SHARE = 1 / 4


class ClaimPolicy:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # requests with libcurl at once
        # Claim when an eighth of the slots are free (or half the prefetch, below): batches
        # big enough for the database, while a slow destination still sees nearly every
        # slot in flight.
        self.threshold = max(1, min(capacity, CLAIM_CAP) // 8)
        # Claims held beyond the free slots, waiting in `ready` for one: twice as many as
        # requests got answered while the last claim ran, at most a claim's worth. With a
        # fast destination the claims, not the HTTP, are what the slots wait for (its
        # requests are answered before the next claim returns): the next batch is then
        # here when an answer frees a slot. With slow answers it stays near zero, and a
        # worker whose slots are all busy leaves the backlog to others
        # (docs/decisions/0010-adaptive-prefetch.md).
        self.prefetch = 0
        self.slow_share = max(1, int(capacity * SLOW_SHARE))
        self.slow_group_share = max(1, int(capacity * SLOW_GROUP_SHARE))
        self.leave_out_slow = True  # False once claims that left them out came back empty
        # When claims last brought deliveries of each destination, over the last
        # OTHERS_IDLE_S: whether the others had work is asked of those not left out.
        self.claimed_at: dict[int, float] = {}
        self.answered_at: dict[int, float] = {}  # destination id -> its last HTTP answer
        self.slow: set[int] = set()  # destinations whose last answer took SLOW_ANSWER_S
        self.trimming = True  # the last left_out() was not letting the slow ones in
        # The destinations the last claim left out, and whether one of them has answered
        # since: it may no longer be silent, and its backlog can be claimed at once
        # (answer, and the claim loop's wait).
        self.left_out_last: frozenset[int] = frozenset()
        self.left_out_answered = False
        self.left_out_at = -math.inf  # when left_out() chose them (monotonic)
        self.retry_due = math.inf  # monotonic time the earliest retry we recorded is due
        self.shared_until = -math.inf  # claims take SHARED_CLAIM_CAP until then (monotonic)

    def limit(self, held: int, recording_backlogged: bool, now: float) -> int:
        """How many to claim now (0: wait for room). `held`: claims between claim and
        result. `recording_backlogged`: too many results wait to be recorded
        (recorder.UNRECORDED_LIMIT): nothing is claimed, so that a slow database slows the
        claiming instead of piling up outcomes in memory. `now`: monotonic time."""
        if recording_backlogged:
            return 0
        free = self.capacity + self.prefetch - held
        if self.room(held) or (held == 0 and free > 0):
            return min(free, SHARED_CLAIM_CAP if now < self.shared_until else CLAIM_CAP)
        return 0

    def room(self, held: int) -> bool:
        free = self.capacity + self.prefetch - held
        return free >= max(self.threshold, self.prefetch // 2)

    def left_out(self, destinations: Mapping[int, DestinationSlots], now: float) -> list[int]:
        """The destinations the next claim leaves out: silent ones holding their share."""
        # Whether that claim is to keep slow destinations to their share (beyond_share).
        self.trimming = self.leave_out_slow
        self.left_out_at = now
        if not self.leave_out_slow:
            return []
        answered_at, slow = self.answered_at, self.slow
        left_out = [destination for destination, slots in destinations.items()
                    if slots.piling_up(self.slow_share, now, answered_at.get(destination),
                                       destination in slow)]
        group, held = self._slow_group(destinations, now)
        if held >= self.slow_group_share:
            left_out = list(set(left_out) | group)
        return left_out

    def _slow_group(
        self, destinations: Mapping[int, DestinationSlots], now: float
    ) -> tuple[set[int], int]:
        """The slow destinations, and the slots they hold: those known slow, and those
        whose oldest running request has gone SLOW_ANSWER_S without any answer since (a
        dead endpoint, before its first timeout tells us)."""
        group = set(self.slow)
        held = 0
        answered_at = self.answered_at
        for destination, slots in destinations.items():
            if not slots.started:
                continue
            if destination not in group:
                oldest = min(slots.started.values())
                if (now - oldest < SLOW_ANSWER_S
                        or answered_at.get(destination, -math.inf) > oldest):
                    continue
                group.add(destination)
            held += len(slots.started)
        return group, held

    def answer(self, destination: int, now: float, took_s: float) -> None:
        """An HTTP answer came from `destination` after `took_s`."""
        self.answered_at[destination] = now
        if destination in self.left_out_last:
            self.left_out_answered = True
        if took_s >= SLOW_ANSWER_S:
            self.slow.add(destination)
        else:
            self.slow.discard(destination)

    def no_answer(self, destination: int, took_s: float) -> None:
        """A request to `destination` ended without an HTTP answer after `took_s` (a
        timeout, a connection that hung): slow, as far as slots go."""
        if took_s >= SLOW_ANSWER_S:
            self.slow.add(destination)

    def beyond_share(
        self, claims: list[Claim], destinations: Mapping[int, DestinationSlots], now: float
    ) -> list[Claim]:
        """The claims of slow destinations beyond their share of the slots (counting the
        requests they have running): to be given back unsent. None from a claim that let
        the slow ones in because nobody else had work (see `claimed`)."""
        if not self.trimming:
            return []
        group, held = self._slow_group(destinations, now)
        if not group:
            return []
        room: dict[int, int] = {}
        group_room = self.slow_group_share - held
        excess: list[Claim] = []
        for claim in claims:
            destination = claim.destination_id
            if destination not in group:
                continue
            if destination not in room:
                slots = destinations.get(destination)
                room[destination] = self.slow_share - (len(slots.started) if slots else 0)
            if room[destination] > 0 and group_room > 0:
                room[destination] -= 1
                group_room -= 1
            else:
                excess.append(claim)
        return excess

    def claimed(self, left_out: list[int], limit: int, claims: Iterable[Claim],
                answered_meanwhile: int, now: float, shared: bool = False) -> bool:
        """Take in what a claim brought back (`now`: monotonic time; `shared`: the claim
        shared its room among tenants with due work); True when there is probably more
        to take at once."""
        if shared:
            self.shared_until = now + SHARED_HOLD_S
        excluded = frozenset(left_out)
        self.left_out_last = excluded
        # Answers that came while the claim ran count too.
        answered_at = self.answered_at
        self.left_out_answered = any(answered_at.get(destination, -math.inf) >= self.left_out_at
                                     for destination in excluded)
        claimed_at = self.claimed_at
        count = 0
        for claim in claims:
            count += 1
            claimed_at[claim.destination_id] = now
        self.leave_out_slow = (not left_out or count > 0
                               or self._others_claimed_within(excluded, now))
        self.prefetch = min(self.capacity, CLAIM_CAP, 2 * answered_meanwhile)
        # A claim that left silent destinations out and found nothing else, the others
        # idle long enough, is followed at once by one that takes them too, not by a
        # wait for the next poll.
        return count == limit or (bool(left_out) and not self.leave_out_slow)

    def _others_claimed_within(self, excluded: frozenset[int], now: float) -> bool:
        """Whether a claim brought deliveries of a destination not in `excluded` within
        OTHERS_IDLE_S. A left-out destination's own claims do not count: a fresh slow
        destination's first claim is what made it hold its share, and counted as the
        others' traffic it kept itself left out for OTHERS_IDLE_S while nobody else had
        work (decision 0021)."""
        claimed_at = self.claimed_at
        for destination in [d for d, at in claimed_at.items() if now - at >= OTHERS_IDLE_S]:
            del claimed_at[destination]
        return any(destination not in excluded for destination in claimed_at)

    def wait_deadline(self) -> float:
        """Until when an idle worker waits for a NOTIFY: the poll interval, or sooner a
        retry it recorded (or a rate-limited destination's next token) falling due."""
        deadline = min(time.monotonic() + POLL_INTERVAL_S, self.retry_due)
        self.retry_due = math.inf
        return deadline

    def rate_limited(self, claims: Iterable[Claim], *, holding_booked: bool = False) -> None:
        """Claim again soon after serving a rate-limited destination: it can book more
        send times while this worker would otherwise wait for the poll interval, and a
        second that passes unbooked is lost to the limit (take_rate_tokens.sql). Also
        while the worker still holds booked claims (`holding_booked`), though this claim
        booked none (its destination was booked a second ahead, or another claimer held
        it): else the booked second could run out before the poll."""
        fastest = max((c.rate_limit for c in claims if c.rate_limit is not None), default=None)
        if fastest is not None:
            wait = min(RATE_RECHECK_MAX_S, max(RATE_RECHECK_MIN_S, 1 / fastest))
        elif holding_booked:
            wait = RATE_RECHECK_MAX_S
        else:
            return
        self.retry_due = min(self.retry_due, time.monotonic() + wait)

    def retries_recorded(self, batch: Iterable[Result]) -> None:
        """Remember when the earliest retry just recorded falls due, so that a short retry
        delay is not stretched to the poll interval."""
        due = [r.next_attempt_at for r in batch if r.outcome == "retry"]
        if due:
            seconds = (min(due) - utcnow()).total_seconds()  # type: ignore[type-var]
            self.retry_due = min(self.retry_due, time.monotonic() + max(0.0, seconds))


def claim_outlived_lease(took_s: float, lease_ms: int, max_timeout_ms: int) -> bool:
    """A claim that took this long may have committed long before its answer came back
    (this process was stopped or starved in between), so its lease may be nearly gone or
    already reaped and sent by another worker: it is to be given back unsent (the release
    is a no-op for rows no longer ours, see record_results.sql)."""
    return took_s * 1000 > lease_ms - max_timeout_ms - LEASE_SAFETY_MS

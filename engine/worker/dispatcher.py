"""`SlotDispatcher`: the one owner of a worker's in-flight state.

Every claim a worker holds, from its claim to its result, is here and nowhere else: held
for its send time (`paced`), waiting for any free slot (`ready`, the prefetch), waiting
for its destination's max_in_flight (`DestinationSlots.waiting`), a spare waiting for a
freed capped slot (`DestinationSlots.spares`), or being sent (`DestinationSlots.started`).
The dispatcher decides what to send next and where a freed capped slot goes; it does
neither HTTP nor database work. Two ports given at construction do that: `send(claim)`
starts one request (False: the claim failed before any HTTP, its result already
recorded), and `record(result)` hands a result to the recorder. It reads the time only
through `clock`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from engine.domain import Claim, Result
from engine.worker import outcome
from engine.worker.send_pacing import SEND_AT_ONCE_S, SendSchedule
from engine.worker.slots import (
    DestinationSlots,
    ReadyQueue,
    Waiting,
    overstayed,
    round_robin_by_destination,
    take_overstayed,
)

# A capped destination gets spare claims (hand_over) only once its answers take this long:
# for one answering in a millisecond the refill brings the slot back before a spare
# would matter, and spares cost more writes than they save
# (docs/decisions/0017-capped-slots-handed-on-to-spares.md).
SPARES_ANSWER_MS = 20
# Spares a worker keeps per slot of such a cap: two, so that those at hand outlast the
# usual flush that brings the next ones; a destination's slots answer together, and one
# per slot ran out in a burst (decision 0017, amended).
SPARES_PER_SLOT = 2
# A rate-limited claim not sent this long after its booked time (a busy loop, slots full)
# is released instead: back to pending, the attempt undone, booked again by a later claim.
# Sent late, it would bunch with the sends booked after it; the bound (rate x 10 + one
# burst of the rate in any 10 s window) leaves a second for lateness (take_rate_tokens.sql),
# and half of it is kept for the network and the receiver.
RATE_LATE_S = 0.5


class Handover(NamedTuple):
    """What an answer does with the capped slot it frees (SlotDispatcher.hand_over)."""

    spare: Claim | None = None  # sent in the slot at once; the result names it (slot_to)
    # The result gives the slot back in the database: it is written at once
    # (recorder.SLOT_FLUSH_INTERVAL_S).
    returns_slot: bool = False
    refill: int | None = None  # ...and the write claims it again for this destination
    spares_for: tuple[int, int] | None = None  # the write claims spares: (id, its cap)


NO_HANDOVER = Handover()
SLOT_GIVEN_BACK = Handover(returns_slot=True)


class SlotDispatcher:
    """Holds a worker's claims until their results and decides which to send when.

    `capacity`: requests with libcurl at once. `small_cap`: the largest max_in_flight
    whose freed slots are handed on or refilled by the result write (the claim loop's
    threshold, decision 0015). `lease_ms`: how long a claim stays this worker's."""

    def __init__(
        self, capacity: int, small_cap: int, lease_ms: int, retry_schedule: list[float],
        send: Callable[[Claim], bool], record: Callable[[Result], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = capacity
        self.small_cap = small_cap
        self.lease_ms = lease_ms
        self.retry_schedule = retry_schedule
        self.send = send
        self.record = record
        self.clock = clock
        self.held = 0  # claims between claim and result, wherever they are
        self.sending = 0  # requests with libcurl: every destination's `started` together
        self.answered = 0  # requests answered so far
        # Claims beyond the free slots (the prefetch), served in turns over destinations.
        self.ready = ReadyQueue()
        # Rate-limited claims waiting for their booked send time (take_rate_tokens.sql).
        self.paced = SendSchedule(self._send_paced)
        self.destinations: dict[int, DestinationSlots] = {}
        # Spares sent in a slot an answer handed on (hand_over), until their own answer.
        self.handed_to: set[int] = set()
        self.stopping = False  # draining: nothing more is sent

    # Claims coming in

    def take(self, claims: Iterable[Claim]) -> None:
        """Claims that may be sent: each goes out now, or waits for its send time or for
        a free slot, in turns over their destinations. One whose attempts are used up is
        recorded dead instead."""
        now = self.clock()
        for claim in round_robin_by_destination(claims):
            if outcome.attempts_used_up(claim, self.retry_schedule):
                self.record(outcome.exhausted(claim))
                continue
            self.held += 1
            if claim.send_delay_s > SEND_AT_ONCE_S:
                self.paced.hold(claim, now)
            elif self.sending < self.capacity:
                self._route(claim, now)
            else:
                self.ready.append((claim, now))

    def give_back(self, claims: Iterable[Claim]) -> None:
        """Claims that are not to be sent (the worker is draining, the claim took too long,
        or they are beyond a slow destination's share): released at once."""
        for claim in claims:
            self.held += 1
            self._release(claim)

    def refilled(self, claims: list[Claim]) -> None:
        """The claims a result write brought back: those holding a slot go out as any
        claim; spares wait for an answer of their destination to free a slot
        (hand_over), and go back at once if nothing of it is running."""
        self.take([claim for claim in claims if claim.holds_slot])
        now = self.clock()
        for spare in claims:
            if spare.holds_slot:
                continue
            self.held += 1
            slots = self.destinations.get(spare.destination_id)
            if slots is None or not slots.started:
                self._release(spare)
            else:
                slots.spares.append((spare, now))

    # Sending

    def _send_paced(self, claim: Claim, since: float) -> None:
        """A rate-limited claim's send time has come: on as any other claim, but ahead of
        those waiting for a free slot (claims prefetched meanwhile would make it late)."""
        if self.stopping:
            self._release(claim)
        elif self.sending < self.capacity:
            self._route(claim, since)
        else:
            self.ready.appendleft((claim, since))

    def _route(self, claim: Claim, since: float) -> None:
        """Start a claim, or queue it behind its destination's max_in_flight."""
        if claim.send_at is not None and self.clock() - since - claim.send_delay_s > RATE_LATE_S:
            self._release(claim)  # too late for its booked send time
            return
        slots = self.destinations.get(claim.destination_id)
        if slots is None:
            slots = self.destinations[claim.destination_id] = DestinationSlots()
        slots.cap = claim.max_in_flight
        if slots.cap is not None and len(slots.started) >= slots.cap:
            slots.waiting.append((claim, since))
        elif not self._start(claim, slots) and slots.idle:
            del self.destinations[claim.destination_id]  # failed before any HTTP

    def _start(self, claim: Claim, slots: DestinationSlots) -> bool:
        """Send one claim in a slot of its destination; False if it failed before any HTTP
        (its result is recorded: it is done, and the slot stays free)."""
        slots.started[claim.id] = self.clock()
        self.sending += 1
        if self.send(claim):
            return True
        del slots.started[claim.id]
        self.sending -= 1
        self.held -= 1
        return False

    # Answers

    def request_ended(self, claim: Claim) -> None:
        """`claim`'s request ended (answered, failed or cut off by the drain)."""
        self.sending -= 1
        self.answered += 1
        self.destinations[claim.destination_id].started.pop(claim.id, None)

    def hand_over(self, claim: Claim, delivered: bool, answer_ms: float,
                  slow: bool) -> Handover:
        """Where the capped slot `claim`'s answer frees goes (between request_ended and
        finished). A success that gives back a slot of a small cap it filled (or was
        handed): to a spare of the same destination if one is at hand, sent at once, else
        back to the database, whose write claims the next delivery for it (refill) and,
        for a destination answering slowly enough, spares for the next answers. Not for a
        large cap (it frees enough slots at once for a claim to refill them, decision
        0015), a failure (the breaker decides what a failing destination gets, through the
        claim), a destination whose answers are slow (`slow`: the claim policy keeps it to
        its share), or while draining."""
        handed = claim.id in self.handed_to
        if handed:
            self.handed_to.discard(claim.id)
        holds_cap_slot = claim.fills_cap or handed
        cap = claim.max_in_flight
        if not (holds_cap_slot and cap is not None and cap <= self.small_cap and delivered
                and not self.stopping and not slow):
            return SLOT_GIVEN_BACK if holds_cap_slot else NO_HANDOVER
        destination = claim.destination_id
        spares_for = (destination, cap) if answer_ms >= SPARES_ANSWER_MS else None
        spare = self._send_spare(self.destinations[destination])
        if spare is None:
            return Handover(returns_slot=True, refill=destination, spares_for=spares_for)
        return Handover(spare=spare, spares_for=spares_for)

    def _send_spare(self, slots: DestinationSlots) -> Claim | None:
        """Send a spare in the slot an answer just freed, if one is at hand whose lease
        still covers it. The request starts within the same turn of the event loop: a
        freed slot otherwise stood empty for a write's round trip (decision 0017)."""
        spares = slots.spares
        now = self.clock()
        while spares:
            spare, since = spares.popleft()
            if overstayed(spare, since, now, self.lease_ms):
                self._release(spare)
                continue
            if self._start(spare, slots):
                self.handed_to.add(spare.id)
                return spare
        return None

    def finished(self, claim: Claim) -> None:
        """`claim`'s result is recorded and its slot free: the next claim waiting for it
        goes out, and for any free slot those in `ready`."""
        self.held -= 1
        destination = claim.destination_id
        slots = self.destinations[destination]
        waiting = slots.waiting
        if not self.stopping:
            while waiting and not self._start(waiting.popleft()[0], slots):
                pass
        if not slots.started and not waiting:
            # Spares can only be sent in a slot an answer frees: with nothing running
            # there is none to come (a failure, a slow answer, the drain).
            while slots.spares:
                self._release(slots.spares.popleft()[0])
            del self.destinations[destination]
        ready = self.ready
        while ready and self.sending < self.capacity and not self.stopping:
            ready_claim, since = ready.popleft()
            self._route(ready_claim, since)

    def spares_wanted(self, caps: dict[int, int]) -> dict[int, int]:
        """How many spares a write is to claim for each destination (id -> its cap):
        SPARES_PER_SLOT per slot of its cap, less those held. A destination all of whose
        requests were answered at once has none running now; the write's refill starts
        them again."""
        wanted = {}
        for destination, cap in caps.items():
            slots = self.destinations.get(destination)
            held = len(slots.spares) if slots is not None else 0
            wanted[destination] = 0 if self.stopping else max(0, SPARES_PER_SLOT * cap - held)
        return wanted

    # Giving back

    def _release(self, claim: Claim) -> None:
        """Give back a claim that was never sent: the attempt is undone."""
        self.held -= 1
        self.record(outcome.released(claim))

    def _unsent_queues(self) -> list[Waiting]:
        """Claims not yet sent: waiting for any free slot, or for their destination's, and
        spares."""
        return [*self.ready.waiting(),
                *(slots.waiting for slots in self.destinations.values()),
                *(slots.spares for slots in self.destinations.values())]

    def release_overstayed(self) -> None:
        """Release the claims that waited for a slot (their destination's cap, or any free
        slot) too long for their lease to still cover their request."""
        overstayed = take_overstayed(self._unsent_queues(), self.clock(), self.lease_ms)
        self.ready.tidy()
        for claim in overstayed:
            self._release(claim)

    def stop(self) -> None:
        """The worker drains: nothing more is sent, no slot handed on, no spare wanted."""
        self.stopping = True

    def release_unsent(self) -> int:
        """Release every claim not yet sent (the drain); how many there were."""
        unsent = 0
        for claim in self.paced.take_all():
            self._release(claim)
            unsent += 1
        for waiting in self._unsent_queues():
            while waiting:
                self._release(waiting.popleft()[0])
                unsent += 1
        self.ready.tidy()
        return unsent

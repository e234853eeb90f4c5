"""Per-destination concurrency in one worker: requests running, claims waiting for a
slot under their destination's max_in_flight, and spares (dispatcher.py keeps them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from engine.domain import Claim

# A destination silent this long (no HTTP answer) while holding its share of the slots is
# left out of claims (claim_policy.SLOW_SHARE says why).
SLOW_REQUEST_S = 0.5
# A claim waiting for its destination's max_in_flight must still be sent within its
# lease: it is released once less than its timeout plus this margin is left.
LEASE_SAFETY_MS = 10_000

# Claims not yet sent, each with the monotonic time it was claimed.
Waiting = deque[tuple[Claim, float]]


class DestinationSlots:
    """Local per-destination concurrency: requests running (`started`: their count is the
    slots taken), claims waiting for a slot, and spares: claims that hold no slot under
    max_in_flight until an answer hands them one (refill_slots.sql;
    SlotDispatcher.hand_over). Kept by engine/worker/dispatcher.py alone."""

    __slots__ = ("cap", "spares", "started", "waiting")

    def __init__(self) -> None:
        self.cap: int | None = None
        self.waiting: Waiting = deque()
        self.spares: Waiting = deque()
        self.started: dict[int, float] = {}  # delivery id -> when its request began

    @property
    def idle(self) -> bool:
        """Nothing of this destination is running or waiting here."""
        return not self.started and not self.waiting and not self.spares

    def piling_up(self, share: int, now: float, answered_at: float | None,
                  slow: bool = False) -> bool:
        """Holding `share` slots or more while silent: no HTTP answer for SLOW_REQUEST_S,
        or none yet in this process. A dead endpoint must not fill the slots during its
        first SLOW_REQUEST_S, when claims come quickly; a live one answers within
        milliseconds and is let through from then on. Silence, not the age of requests:
        on a starved CPU even a fast endpoint's requests get old, but answers keep coming.
        `slow`: its answers are known to take seconds (ClaimPolicy.answer), so it is not
        let through on the strength of its answers."""
        if len(self.started) < share:
            return False
        return slow or answered_at is None or now - answered_at > SLOW_REQUEST_S


def round_robin_by_destination(claims: Iterable[Claim]) -> list[Claim]:
    """The claims in turns over their destinations (in the order each first appears),
    each destination's own in claim order: a claim holding one destination's backlog and
    another's single fresh delivery sends that one among the first, not after the
    backlog (the dispatch of a 500-row claim takes tens of milliseconds on a busy CPU;
    issue 39's noisy neighbour)."""
    queues: dict[int, deque[Claim]] = {}
    for claim in claims:
        queue = queues.get(claim.destination_id)
        if queue is None:
            queue = queues[claim.destination_id] = deque()
        queue.append(claim)
    if len(queues) < 2:
        return [claim for queue in queues.values() for claim in queue]
    turns: list[Claim] = []
    active = list(queues.values())
    while active:
        turns.extend(queue.popleft() for queue in active)
        active = [queue for queue in active if queue]
    return turns


def overstayed(claim: Claim, since: float, now: float, lease_ms: int) -> bool:
    """Waited too long for its lease to still cover its request."""
    return (now - since) * 1000 >= lease_ms - claim.timeout_ms - LEASE_SAFETY_MS


class ReadyQueue:
    """Claims waiting for any free slot of the worker (the prefetch), a queue per
    destination, served in turns: a freed slot goes to the next destination in line, so
    a tenant's single fresh delivery waits for one slot, not behind the hundreds another
    destination's backlog has prefetched (issue 39's noisy neighbour: B's deliveries
    waited 90-200 ms at p50 in a FIFO while A drained). Each destination's claims keep
    their claiming order."""

    __slots__ = ("count", "queues", "turns")

    def __init__(self) -> None:
        self.queues: dict[int, Waiting] = {}
        self.turns: deque[int] = deque()  # destinations with claims here, next first
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def append(self, item: tuple[Claim, float]) -> None:
        destination = item[0].destination_id
        queue = self.queues.get(destination)
        if queue is None:
            queue = self.queues[destination] = deque()
            self.turns.append(destination)
        queue.append(item)
        self.count += 1

    def appendleft(self, item: tuple[Claim, float]) -> None:
        """Ahead of every claim here (a rate-limited claim whose send time came)."""
        destination = item[0].destination_id
        queue = self.queues.get(destination)
        if queue is None:
            queue = self.queues[destination] = deque()
        else:
            self.turns.remove(destination)
        self.turns.appendleft(destination)
        queue.appendleft(item)
        self.count += 1

    def popleft(self) -> tuple[Claim, float]:
        """The next destination's oldest claim; that destination goes to the back."""
        destination = self.turns.popleft()
        queue = self.queues[destination]
        item = queue.popleft()
        if queue:
            self.turns.append(destination)
        else:
            del self.queues[destination]
        self.count -= 1
        return item

    def waiting(self) -> list[Waiting]:
        """The per-destination queues (each oldest first), for take_overstayed and the
        drain; call `tidy` after taking from them."""
        return list(self.queues.values())

    def tidy(self) -> None:
        """Forget the destinations whose queues were emptied from outside."""
        for destination in [d for d, queue in self.queues.items() if not queue]:
            del self.queues[destination]
            self.turns.remove(destination)
        self.count = sum(len(queue) for queue in self.queues.values())


def take_overstayed(queues: Iterable[Waiting], now: float, lease_ms: int) -> list[Claim]:
    """Remove and return the claims that waited too long for their lease to still cover
    their request (each queue is in claiming order: the oldest first)."""
    found: list[Claim] = []
    for waiting in queues:
        while waiting:
            claim, since = waiting[0]
            if not overstayed(claim, since, now, lease_ms):
                break
            waiting.popleft()
            found.append(claim)
    return found

"""When a worker leaves a silent destination out of its claims, and when it lets it back in
(engine/worker/claim_policy.py). Pure: the policy is driven with explicit monotonic times,
as the claim loop drives it."""

from __future__ import annotations

from engine.domain import Claim
from engine.worker.claim_policy import (
    CLAIM_CAP,
    OTHERS_IDLE_S,
    SHARED_CLAIM_CAP,
    SHARED_HOLD_S,
    SLOW_ANSWER_S,
    ClaimPolicy,
)
from engine.worker.slots import SLOW_REQUEST_S, DestinationSlots

CAPACITY = 64
SLOW, HEALTHY = 1, 2


def claim(delivery_id: int, destination_id: int) -> Claim:
    return Claim(delivery_id, delivery_id, destination_id, 1, "http://127.0.0.1:9/", 5000,
                 [], "{}")


def piling_up(policy: ClaimPolicy, since: float, held: int | None = None
              ) -> dict[int, DestinationSlots]:
    """SLOW holds `held` slots (default: its share) with requests started at `since`."""
    slots = DestinationSlots()
    slots.started = {n: since for n in range(policy.slow_share if held is None else held)}
    return {SLOW: slots}


def test_a_slow_destination_holding_its_share_is_left_out() -> None:
    policy = ClaimPolicy(CAPACITY)
    assert policy.left_out(piling_up(policy, 0.0), SLOW_REQUEST_S + 0.1) == [SLOW]
    answered = ClaimPolicy(CAPACITY)
    answered.answered_at[SLOW] = 1.0
    assert answered.left_out(piling_up(answered, 0.0), 1.0 + SLOW_REQUEST_S / 2) == []


def test_a_gap_in_healthy_traffic_does_not_hand_the_slots_to_the_slow_destination() -> None:
    policy = ClaimPolicy(CAPACITY)
    t = 10.0
    destinations = piling_up(policy, t - 1)
    # A claim that left SLOW out brought healthy deliveries...
    assert policy.left_out(destinations, t) == [SLOW]
    policy.claimed([SLOW], 20, [claim(1, HEALTHY)], 0, t)
    # ...and the next, a moment later, found nothing: a gap in the trickle.
    t += 0.05
    assert policy.left_out(destinations, t) == [SLOW]
    more_now = policy.claimed([SLOW], 20, [], 0, t)
    assert not more_now, "an empty claim right after healthy traffic claimed again at once"
    assert policy.left_out(destinations, t + 0.01) == [SLOW]
    # Still idle just before OTHERS_IDLE_S: still left out.
    t += OTHERS_IDLE_S - 0.1
    policy.claimed([SLOW], 20, [], 0, t)
    assert policy.left_out(destinations, t) == [SLOW]


def test_once_the_others_stay_idle_the_slow_destination_gets_the_free_slots() -> None:
    policy = ClaimPolicy(CAPACITY)
    t = 10.0
    destinations = piling_up(policy, t - 1)
    policy.claimed([SLOW], 20, [claim(1, HEALTHY)], 0, t)
    t += OTHERS_IDLE_S + 0.01
    more_now = policy.claimed([SLOW], 20, [], 0, t)
    assert more_now, "the claim that takes the slow destination too comes at once"
    assert policy.left_out(destinations, t) == []
    # That claim (nothing left out) takes SLOW's deliveries; after it the rule is back.
    policy.claimed([], 20, [claim(2, SLOW)], 0, t)
    assert policy.left_out(destinations, t) == [SLOW]


def test_a_fresh_destinations_own_first_claim_is_not_the_others_traffic() -> None:
    """A backlog of a fresh destination, nothing else with work: its first claim took its
    share, it is left out until it answers, and the next claim that finds nothing else
    lets it in at once. Its own first claim must not count as the others' traffic (that
    kept half the slots idle for a whole answer time in bench drain-slow)."""
    policy = ClaimPolicy(CAPACITY)
    t = 10.0
    policy.claimed([], 20, [claim(n, SLOW) for n in range(20)], 0, t)  # its first claim
    destinations = piling_up(policy, t)
    t += 0.05
    assert policy.left_out(destinations, t) == [SLOW]
    more_now = policy.claimed([SLOW], 20, [], 0, t)
    assert more_now, "nobody else had work: the slow destination is let in at once"
    assert policy.left_out(destinations, t) == []
    # Healthy traffic a moment ago still keeps it to its share.
    policy.claimed([], 20, [claim(99, HEALTHY)], 0, t)
    policy.claimed([], 20, [claim(100, SLOW)], 0, t + 0.01)
    assert policy.left_out(destinations, t + 0.02) == [SLOW]
    assert not policy.claimed([SLOW], 20, [], 0, t + 0.02)


def test_a_slow_destination_alone_is_let_in_at_once() -> None:
    """Nothing else was ever claimed: no one to protect, no wait."""
    policy = ClaimPolicy(CAPACITY)
    destinations = piling_up(policy, 0.0)
    assert policy.left_out(destinations, 5.0) == [SLOW]
    assert policy.claimed([SLOW], 20, [], 0, 5.0)
    assert policy.left_out(destinations, 5.0) == []


def test_a_slow_but_answering_destination_holding_its_share_is_left_out() -> None:
    policy = ClaimPolicy(CAPACITY)
    destinations = piling_up(policy, 9.0)
    policy.answer(SLOW, 10.0, SLOW_ANSWER_S + 1)  # answered just now, after 3 s
    assert policy.left_out(destinations, 10.01) == [SLOW]
    policy.answer(SLOW, 10.02, 0.05)  # a fast answer: normal again
    assert policy.left_out(destinations, 10.03) == []


def test_a_claim_gives_back_what_a_slow_destination_has_beyond_its_share() -> None:
    policy = ClaimPolicy(CAPACITY)
    policy.answer(SLOW, 10.0, SLOW_ANSWER_S + 1)
    destinations = piling_up(policy, 9.0, held=policy.slow_share - 2)
    claims = [claim(n, SLOW) for n in range(1, 6)] + [claim(n, HEALTHY) for n in range(6, 9)]
    excess = policy.beyond_share(claims, destinations, 10.0)
    assert [c.id for c in excess] == [3, 4, 5], "keeps the two oldest, gives back the rest"
    # Not slow (its answers are fast), or let in because nobody else had work: all kept.
    assert ClaimPolicy(CAPACITY).beyond_share(claims, destinations, 10.0) == []
    policy.leave_out_slow = False
    assert policy.left_out(destinations, 10.0) == []  # the claim that lets them in...
    policy.claimed([], 20, claims, 0, 10.0)
    assert policy.beyond_share(claims, destinations, 10.0) == []  # ...keeps all it took


def test_many_dead_endpoints_together_keep_to_the_group_share() -> None:
    """Fifty endpoints with one unanswered request each hold no share of their own, but
    together they are left out once they hold the group's share, and a claim's deliveries
    to them beyond the group's room are given back."""
    policy = ClaimPolicy(CAPACITY)
    dead = list(range(100, 100 + policy.slow_group_share))
    destinations: dict[int, DestinationSlots] = {}
    for n, destination in enumerate(dead):
        slots = destinations[destination] = DestinationSlots()
        slots.started = {n: 0.0}
    young = SLOW_ANSWER_S / 2  # not yet: a fast endpoint's request may be that old
    assert policy.left_out(destinations, young) == []
    late = SLOW_ANSWER_S + 0.5
    assert sorted(policy.left_out(destinations, late)) == dead
    # One of them answered after its oldest request began: not dead, not in the group.
    policy.answered_at[dead[0]] = 1.0
    assert policy.left_out(destinations, late) == []
    # Room for one more in the group: a claim keeps one delivery to a silent endpoint.
    del policy.answered_at[dead[0]]
    del destinations[dead[0]]
    policy.left_out(destinations, late)
    claims = [claim(1, dead[1]), claim(2, HEALTHY), claim(3, dead[2])]
    assert [c.id for c in policy.beyond_share(claims, destinations, late)] == [3]


def test_an_answer_from_a_left_out_destination_ends_the_wait_for_work() -> None:
    """A fresh destination with a backlog is left out while it has no answer yet; its first
    answer, even one that came while the claim that left it out ran, lets the claim loop
    claim again at once instead of waiting for the poll."""
    policy = ClaimPolicy(CAPACITY)
    t = 10.0
    policy.claimed_at[HEALTHY] = t  # healthy traffic just now: SLOW stays left out
    assert policy.left_out(piling_up(policy, t), t + SLOW_REQUEST_S) == [SLOW]
    policy.answer(SLOW, t + SLOW_REQUEST_S + 0.01, 0.01)  # during the claim
    assert not policy.claimed([SLOW], 10, [], 0, t + SLOW_REQUEST_S + 0.02)
    assert policy.left_out_answered
    t = 20.0  # silent again
    policy.claimed_at[HEALTHY] = t
    assert policy.left_out(piling_up(policy, t), t) == [SLOW]
    policy.claimed([SLOW], 10, [], 0, t + 0.01)
    assert not policy.left_out_answered
    policy.answer(HEALTHY, t + 0.02, 0.01)
    assert not policy.left_out_answered, "an answer from another destination"
    policy.answer(SLOW, t + 0.03, 0.01)
    assert policy.left_out_answered


def test_claims_are_smaller_while_other_tenants_work_waits() -> None:
    """After a claim that shared its room among tenants, claims take at most
    SHARED_CLAIM_CAP for SHARED_HOLD_S (the next claim, with the others' next due rows,
    comes sooner); a claim for one tenant alone keeps CLAIM_CAP."""
    policy = ClaimPolicy(1024)
    assert policy.limit(0, False, 0.0) == CLAIM_CAP
    policy.claimed([], CLAIM_CAP, [claim(n, HEALTHY) for n in range(CLAIM_CAP)], 0, 1.0,
                   shared=False)
    assert policy.limit(0, False, 1.0) == CLAIM_CAP
    policy.claimed([], CLAIM_CAP, [claim(n, HEALTHY) for n in range(CLAIM_CAP)], 0, 2.0,
                   shared=True)
    assert policy.limit(0, False, 2.0) == SHARED_CLAIM_CAP
    assert policy.limit(0, False, 2.0 + SHARED_HOLD_S - 0.01) == SHARED_CLAIM_CAP
    # Unshared claims meanwhile do not end the hold early: one tenant's work may be due
    # between two of the other's.
    policy.claimed([], SHARED_CLAIM_CAP, [claim(1, HEALTHY)], 0, 2.5, shared=False)
    assert policy.limit(0, False, 2.6) == SHARED_CLAIM_CAP
    assert policy.limit(0, False, 2.0 + SHARED_HOLD_S) == CLAIM_CAP
    # Fewer free slots than the cap: the free slots.
    assert policy.limit(1024 - 100, False, 2.1) == 100

"""engine/worker/dispatcher.py without a database, HTTP or event loop: where a freed
capped slot goes (a spare, or back to the database for the write to refill it), which
claims wait for their destination's cap, and what is given back. The dispatcher's two
ports are lists here and its clock a number the test moves. The recorder's part of a
handover, folding a chain into the result still waiting, is at the end."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from engine.domain import BreakerSettings, Claim, Result
from engine.observe.oplog import Outage
from engine.worker import outcome
from engine.worker.connection import DrainDeadline
from engine.worker.dispatcher import (
    NO_HANDOVER,
    SPARES_ANSWER_MS,
    SPARES_PER_SLOT,
    Handover,
    SlotDispatcher,
)
from engine.worker.recorder import ResultRecorder
from engine.worker.slots import LEASE_SAFETY_MS, ReadyQueue, round_robin_by_destination

LEASE_MS = 60_000
TIMEOUT_MS = 5_000
SMALL_CAP = 62
DESTINATION = 7


class Ports:
    """What the dispatcher sends and records, and a clock."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.recorded: list[Result] = []
        self.now = 100.0
        self.unsignable: set[int] = set()

    def send(self, claim: Claim) -> bool:
        if claim.id in self.unsignable:
            self.recorded.append(outcome.released(claim))  # stands for the failure
            return False
        self.sent.append(claim.id)
        return True

    def released(self) -> list[int]:
        return [r.id for r in self.recorded if r.outcome == "released"]


def capped(delivery_id: int, cap: int = 5, **kw: bool) -> Claim:
    return Claim(delivery_id, delivery_id, DESTINATION, 1, "http://127.0.0.1:9/", TIMEOUT_MS,
                 [], "{}", max_in_flight=cap, claim_token=1000 + delivery_id, **kw)


def dispatcher(ports: Ports, capacity: int = 100) -> SlotDispatcher:
    return SlotDispatcher(capacity, SMALL_CAP, LEASE_MS, [1.0], ports.send,
                          ports.recorded.append, clock=lambda: ports.now)


def running(ports: Ports, cap: int = 5, count: int = 1, spares: int = 0
            ) -> tuple[SlotDispatcher, list[Claim]]:
    """A dispatcher with `count` requests of a capped destination running, each having
    filled the cap, and `spares` spares of it held (brought by a result write)."""
    d = dispatcher(ports)
    claims = [capped(i, cap, fills_cap=True, holds_slot=True) for i in range(1, count + 1)]
    d.take(claims)
    d.refilled([capped(100 + i, cap) for i in range(spares)])
    return d, claims


def answer(d: SlotDispatcher, claim: Claim, delivered: bool = True,
           answer_ms: float = 100.0, slow: bool = False) -> Handover:
    d.request_ended(claim)
    handover = d.hand_over(claim, delivered, answer_ms, slow)
    d.finished(claim)
    return handover


def test_a_success_hands_its_slot_to_a_spare_sent_at_once() -> None:
    ports = Ports()
    d, (source,) = running(ports, spares=2)
    assert ports.sent == [1]
    handover = answer(d, source)
    spare_id = ports.sent[-1]
    assert spare_id == 100  # the oldest spare, sent within the answer
    assert handover == Handover(spare=handover.spare, spares_for=(DESTINATION, 5))
    assert handover.spare is not None and handover.spare.id == spare_id
    assert not handover.returns_slot and handover.refill is None
    assert d.handed_to == {spare_id}
    assert list(d.destinations[DESTINATION].started) == [spare_id]
    assert d.held == 2 and d.sending == 1  # the spare sent, the other still held
    # The spare's own answer hands the slot on again, though its claim filled no cap.
    assert answer(d, handover.spare).spare == capped(101)
    assert d.handed_to == {101}


def test_without_a_spare_the_slot_goes_back_for_the_write_to_refill() -> None:
    ports = Ports()
    d, (source,) = running(ports)
    assert answer(d, source) == Handover(returns_slot=True, refill=DESTINATION,
                                         spares_for=(DESTINATION, 5))
    assert ports.sent == [1] and d.held == 0 and d.destinations == {}


def test_a_fast_destination_gets_no_spares() -> None:
    ports = Ports()
    d, (source,) = running(ports)
    assert answer(d, source, answer_ms=SPARES_ANSWER_MS - 1) == Handover(
        returns_slot=True, refill=DESTINATION)


@pytest.mark.parametrize("case", ["failure", "slow", "large cap", "draining"])
def test_no_handover_and_no_refill(case: str) -> None:
    """A failure (the breaker decides through the claim), a slow destination (kept to its
    share by the claim policy), a cap above the claim threshold (a claim refills it),
    and a draining worker: the slot goes back, nothing is sent in it, nothing refilled."""
    ports = Ports()
    cap = SMALL_CAP + 1 if case == "large cap" else 5
    d, (source, _) = running(ports, cap=cap, count=2, spares=2)
    if case == "draining":
        d.stop()
    handover = answer(d, source, delivered=case != "failure", slow=case == "slow")
    assert handover == Handover(returns_slot=True)
    assert ports.sent == [1, 2] and not d.handed_to


def test_a_claim_that_holds_no_capped_slot_returns_none() -> None:
    ports = Ports()
    d = dispatcher(ports)
    plain = capped(1, fills_cap=False)
    d.take([plain])
    assert answer(d, plain) is NO_HANDOVER


def test_a_spare_past_its_lease_is_released_and_the_next_one_sent() -> None:
    ports = Ports()
    d, (source,) = running(ports, count=1, spares=1)
    ports.now += (LEASE_MS - TIMEOUT_MS - LEASE_SAFETY_MS) / 1000  # the first spare's age
    d.refilled([capped(200)])
    handover = answer(d, source)
    assert handover.spare == capped(200)
    assert ports.released() == [100]
    assert d.held == 1


def test_an_unsignable_spare_leaves_the_slot_to_the_next_one() -> None:
    ports = Ports()
    ports.unsignable.add(100)
    d, (source,) = running(ports, spares=2)
    handover = answer(d, source)
    assert handover.spare == capped(101) and d.handed_to == {101}
    assert d.held == 1 and d.sending == 1


def test_spares_go_back_when_nothing_of_their_destination_runs() -> None:
    ports = Ports()
    d, (source,) = running(ports, spares=2)
    answer(d, source, delivered=False)
    assert ports.released() == [100, 101] and d.held == 0 and d.destinations == {}
    # Brought by a write after the last answer: back at once.
    d.refilled([capped(300)])
    assert ports.released() == [100, 101, 300] and d.held == 0


def test_spares_wanted_per_slot_less_those_held() -> None:
    ports = Ports()
    d, _ = running(ports, cap=5, spares=3)
    assert d.spares_wanted({DESTINATION: 5, 8: 2}) == {
        DESTINATION: SPARES_PER_SLOT * 5 - 3, 8: SPARES_PER_SLOT * 2}
    d.stop()
    assert d.spares_wanted({DESTINATION: 5}) == {DESTINATION: 0}


def test_claims_beyond_a_cap_wait_and_an_answer_sends_the_next() -> None:
    ports = Ports()
    d = dispatcher(ports)
    claims = [capped(i, cap=2, holds_slot=True) for i in range(1, 5)]
    d.take(claims)
    assert ports.sent == [1, 2] and len(d.destinations[DESTINATION].waiting) == 2
    answer(d, claims[0], delivered=False)
    assert ports.sent == [1, 2, 3] and d.sending == 2 and d.held == 3
    # The drain: nothing more is sent, and what waits goes back.
    d.stop()
    answer(d, claims[1], delivered=False)
    assert ports.sent == [1, 2, 3]
    assert d.release_unsent() == 1 and ports.released() == [4] and d.held == 1


def test_beyond_the_capacity_claims_wait_in_ready() -> None:
    ports = Ports()
    d = dispatcher(ports, capacity=2)
    claims = [Claim(i, i, i, 1, "http://127.0.0.1:9/", TIMEOUT_MS, [], "{}")
              for i in range(1, 5)]
    d.take(claims)
    assert ports.sent == [1, 2] and len(d.ready) == 2
    answer(d, claims[0], delivered=False)
    assert ports.sent == [1, 2, 3] and len(d.ready) == 1


def test_a_handed_on_result_still_waiting_hands_the_slot_on_itself() -> None:
    """Source A handed its slot to spare B; B is answered and hands it to C while A's
    result still waits: A's result names C, and B's names none (in one statement B's row
    would not hold the slot yet). Once A's result is being written, B's names C."""
    async def scenario() -> tuple[list[Result], list[Result]]:
        recorder = ResultRecorder("postgresql://unused", "w", BreakerSettings(5, 1, 2),
                                  LEASE_MS, Outage("worker"), DrainDeadline())
        recorder.loop = asyncio.get_running_loop()

        def success(claim: Claim, to: Claim) -> Result:
            return Result(claim.id, 1, "delivered", outcome.utcnow(),
                          claim_token=claim.claim_token, slot_to=to.id,
                          slot_to_token=to.claim_token)

        a, b, c, d = capped(1), capped(2), capped(3), capped(4)
        recorder.add(success(a, b))
        recorder.add(success(b, c))
        folded = list(recorder.results)
        batch = await recorder.next_batch()
        assert batch is not None and batch.results == folded
        recorder.add(success(c, d))
        return folded, recorder.results

    folded, later = asyncio.run(scenario())
    assert [(r.id, r.slot_to, r.slot_to_token) for r in folded] == [
        (1, 3, 1003), (2, None, None)]
    assert [(r.id, r.slot_to) for r in later] == [(3, 4)]


@given(st.lists(st.integers(min_value=1, max_value=6), max_size=60))
def test_a_claim_goes_out_in_turns_over_its_destinations(destinations: list[int]) -> None:
    """Each destination's first claim is among the first as many claims as there are
    destinations, each destination's claims keep their order (ordered destinations rely
    on it), and every claim is there once."""
    claims = [Claim(id=n, event_id=n, destination_id=d, attempt=1, url="http://x/",
                    timeout_ms=1000, secrets=["s"], payload="{}")
              for n, d in enumerate(destinations)]
    turns = round_robin_by_destination(claims)
    assert sorted(c.id for c in turns) == list(range(len(claims)))
    distinct = len(set(destinations))
    assert {c.destination_id for c in turns[:distinct]} == set(destinations)
    for destination in set(destinations):
        assert [c.id for c in turns if c.destination_id == destination] == [
            c.id for c in claims if c.destination_id == destination]


def test_a_freed_slot_goes_to_the_next_destination_in_line_not_the_oldest_claim() -> None:
    """A claim of another destination, prefetched after a backlog's, waits for a slot
    per destination ahead of it in line, not for the backlog (issue 39: tenant B's fresh
    delivery behind tenant A's prefetch)."""
    ports = Ports()
    d = dispatcher(ports, capacity=2)
    backlog = [Claim(i, i, 1, 1, "http://127.0.0.1:9/a", TIMEOUT_MS, [], "{}")
               for i in range(1, 11)]
    fresh = Claim(99, 99, 2, 1, "http://127.0.0.1:9/b", TIMEOUT_MS, [], "{}")
    d.take(backlog)
    d.take([fresh])
    assert ports.sent == [1, 2] and len(d.ready) == 9
    answer(d, backlog[0])
    answer(d, backlog[1])
    assert ports.sent == [1, 2, 3, 99]
    answer(d, fresh)
    assert ports.sent == [1, 2, 3, 99, 4] and len(d.ready) == 6
    assert d.release_unsent() == 6 and len(d.ready) == 0 and not d.ready.turns


@given(st.lists(st.tuples(st.sampled_from(["append", "append", "appendleft", "popleft"]),
                          st.integers(min_value=1, max_value=3)), max_size=80))
@example([("append", 1), ("append", 1), ("append", 1), ("append", 2),
          ("popleft", 0), ("popleft", 0), ("popleft", 0)])
def test_the_ready_queue_serves_destinations_in_turns(steps: list[tuple[str, int]]) -> None:
    """Against a model: every claim comes out once; a destination's claims in the order
    they went in (one put ahead first); a destination with claims waiting is served
    before any other destination is served twice (counting from the last put ahead)."""
    ready = ReadyQueue()
    model: dict[int, list[int]] = {}
    # Waiting destination -> [pops since it was last served (or came, or one was put
    # ahead), the most destinations waiting at once meanwhile].
    waited: dict[int, list[int]] = {}
    n = 0
    for op, destination in steps:
        if op == "popleft":
            if not ready:
                assert not any(model.values())
                continue
            claim, _ = ready.popleft()
            got = claim.destination_id
            assert claim.id == model[got].pop(0)
            for other, counts in waited.items():
                counts[0] += 1
                assert counts[0] <= counts[1], (other, counts)
            waited[got] = [0, len(waited)]
            if not model[got]:
                del waited[got]
        else:
            n += 1
            claim = Claim(n, n, destination, 1, "http://x/", 1000, ["s"], "{}")
            getattr(ready, op)((claim, 0.0))
            queue = model.setdefault(destination, [])
            queue.insert(0, n) if op == "appendleft" else queue.append(n)
            waited.setdefault(destination, [0, 0])
            if op == "appendleft":
                # Put ahead of everyone (a paced claim whose time came): the turns start
                # over from it.
                waited = {d: [0, 0] for d in waited}
        for counts in waited.values():
            counts[1] = max(counts[1], len(waited))
        assert len(ready) == sum(len(q) for q in model.values())

"""engine/worker/send_pacing.py on a real event loop: held claims are handed on in send-time
order, none before its time, and a drain takes back what is still waiting."""

from __future__ import annotations

import asyncio
import time

import uvloop

from engine.db.queue import Claim
from engine.worker.send_pacing import SEND_AT_ONCE_S, SendSchedule


def claim(delivery_id: int, delay_s: float) -> Claim:
    return Claim(delivery_id, delivery_id, 1, 1, "http://127.0.0.1:9/", 1000, [], "{}",
                 rate_limit=10.0, send_delay_s=delay_s)


def test_held_claims_go_in_send_time_order_and_not_before() -> None:
    delays = {1: 0.06, 2: 0.02, 3: 0.04, 4: 0.02}

    async def main() -> list[tuple[int, float, float]]:
        loop = asyncio.get_running_loop()
        sent: list[tuple[int, float, float]] = []
        everything = loop.create_future()
        held_at: dict[int, float] = {}

        def send(held: Claim, since: float) -> None:
            sent.append((held.id, loop.time() - held_at[held.id], since))
            if len(sent) == len(delays):
                everything.set_result(None)

        schedule = SendSchedule(send)
        for delivery_id, delay in delays.items():
            held_at[delivery_id] = loop.time()
            schedule.hold(claim(delivery_id, delay), since=float(delivery_id))
        assert len(schedule) == len(delays)
        await everything
        assert len(schedule) == 0
        return sent

    sent = uvloop.run(main())
    # Due order; equal times in the order held; `since` passed through.
    assert [delivery_id for delivery_id, _, _ in sent] == [2, 4, 3, 1]
    assert all(since == delivery_id for delivery_id, _, since in sent)
    for delivery_id, waited, _ in sent:
        assert waited >= delays[delivery_id] - SEND_AT_ONCE_S, (delivery_id, waited)


def test_a_drain_takes_back_what_waits() -> None:
    async def main() -> tuple[list[int], list[int], int]:
        first_sent = asyncio.get_running_loop().create_future()
        sent: list[int] = []

        def send(held: Claim, _: float) -> None:
            sent.append(held.id)
            first_sent.set_result(None)

        schedule = SendSchedule(send)
        schedule.hold(claim(1, 0.01), since=0.0)
        schedule.hold(claim(2, 30.0), since=0.0)
        await first_sent
        taken = [held.id for held in schedule.take_all()]
        return sent, taken, len(schedule)

    assert uvloop.run(main()) == ([1], [2], 0)


def test_a_slow_send_that_passes_the_next_send_time_breaks_nothing() -> None:
    """A send that takes longer than the gap to the next claim's send time (a loaded
    machine) leaves that time in the past when the timer is set again, and uvloop's
    call_at then returns a plain Handle, with no when(). A claim held after that must
    still be scheduled, and every claim sent, in order (2026-12-02: it raised)."""

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        past = loop.call_at(loop.time() - 0.001, lambda: None)
        assert not hasattr(past, "when")  # the premise: uvloop's handle for a past time
        past.cancel()
        sent: list[int] = []
        everything = loop.create_future()
        schedule: SendSchedule
        errors: list[dict[str, object]] = []  # what callbacks raised
        loop.set_exception_handler(lambda _, context: errors.append(context))

        def send(held: Claim, _: float) -> None:
            sent.append(held.id)
            if held.id == 1:
                time.sleep(0.06)  # claim 2 falls due meanwhile
                # Held once this send is over and the timer set again for claim 2.
                loop.call_soon(schedule.hold, claim(3, 0.03), 0.0)
            if len(sent) == 3:
                everything.set_result(None)

        schedule = SendSchedule(send)
        schedule.hold(claim(1, 0.01), since=0.0)
        schedule.hold(claim(2, 0.03), since=0.0)
        await asyncio.wait_for(everything, 5)
        assert not errors, errors
        return sent

    assert uvloop.run(main()) == [1, 2, 3]

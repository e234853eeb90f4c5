"""Send times for the claims of tenants with limits of their own (claim_limited_tenants.sql):
a pure function of the claims and the schedules they were claimed under.

A rate limit is a schedule of send times 1/rate apart (take_rate_tokens.sql says why).
Where only a tenant or only a destination is rate limited, its claims go at its next send
time and then 1/rate apart. Where both are, each send must keep both spacings, and a send
moved later by one schedule must not come closer to the next of the other: the choice is
sequential. Greedy: among the claims left, the next send is the one that can go earliest
(no earlier than the tenant's next send time, nor than its destination's if that is rate
limited; in id order within a destination), and each send moves the next send times of
its tenant and destination 1/rate past it. Every send then keeps both spacings, and the
next send times returned are where the next claim's schedules go on (book_send_times.sql
writes them in the claim's transaction; docs/decisions/0029).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Paced:
    """One claim to schedule: its id, its destination, and that destination's rate limit
    and first send time if the claim was booked under it (None: not rate limited)."""

    id: int
    destination_id: int
    destination_rate: float | None = None
    destination_first_send_at: dt.datetime | None = None


@dataclass(frozen=True)
class Schedule:
    send_at: dict[int, dt.datetime]  # claim id -> send time (rate-limited claims only)
    tenant_next_send_at: dt.datetime | None  # None: the tenant is not rate limited
    destination_next_send_at: dict[int, dt.datetime]


def tenant_schedule(
    claims: Sequence[Paced], tenant_rate: float | None, tenant_first_send_at: dt.datetime | None,
) -> Schedule:
    """The send times of one tenant's claims, and the next send times after them."""
    queues: dict[int | None, list[Paced]] = {}
    for claim in sorted(claims, key=lambda c: c.id):
        key = claim.destination_id if claim.destination_rate is not None else None
        queues.setdefault(key, []).append(claim)
    destination_next: dict[int, dt.datetime] = {
        key: queue[0].destination_first_send_at  # type: ignore[misc]
        for key, queue in queues.items() if key is not None}
    rates: Mapping[int, float] = {
        key: queue[0].destination_rate  # type: ignore[misc]
        for key, queue in queues.items() if key is not None}
    tenant_next = tenant_first_send_at
    send_at: dict[int, dt.datetime] = {}
    if tenant_rate is None:
        queues.pop(None, None)  # unpaced
    while queues:
        # The earliest any claim left can go (no earlier than its tenant's next send time
        # nor its destination's); ties: the tenant's own claims first, then by destination.
        at, _, key = min(
            (max(t for t in (tenant_next, destination_next.get(k)) if t is not None),
             k is not None, k)
            for k in queues)
        claim = queues[key].pop(0)
        if not queues[key]:
            del queues[key]
        send_at[claim.id] = at
        if tenant_rate is not None:
            tenant_next = at + dt.timedelta(seconds=1 / tenant_rate)
        if key is not None:
            destination_next[key] = at + dt.timedelta(seconds=1 / rates[key])
    return Schedule(send_at, tenant_next if tenant_rate is not None else None,
                    destination_next)

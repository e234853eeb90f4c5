"""engine/db/send_schedule.py, the send times of a limited tenant's claims: for any mix of
claims of rate-limited and other destinations, under a rate-limited tenant or not, every
claim under a limit gets a send time; no two of the tenant's sends are closer than
1/its rate, nor two of a destination's than 1/its; none goes before its schedules' first
send times; and the next send times come 1/rate after the last send of each schedule."""

from __future__ import annotations

import datetime as dt
import itertools

from hypothesis import given
from hypothesis import strategies as st

from engine.db.send_schedule import Paced, tenant_schedule

T0 = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
# timedelta counts microseconds: each send time may be rounded by one.
ROUNDING_S = 2e-6


@st.composite
def tenants(draw: st.DrawFn) -> tuple[list[Paced], float | None, dt.datetime | None]:
    rates = draw(st.lists(st.one_of(st.none(), st.sampled_from([2.0, 8.0, 50.0])),
                          min_size=1, max_size=4))
    firsts = [T0 + dt.timedelta(milliseconds=draw(st.integers(0, 1000))) for _ in rates]
    claims = [Paced(n, destination, rates[destination],
                    firsts[destination] if rates[destination] is not None else None)
              for n, destination in enumerate(draw(st.lists(
                  st.integers(0, len(rates) - 1), min_size=1, max_size=40)))]
    tenant_rate = draw(st.one_of(st.none(), st.sampled_from([5.0, 20.0, 100.0])))
    first = T0 + dt.timedelta(milliseconds=draw(st.integers(0, 1000)))
    return claims, tenant_rate, first if tenant_rate is not None else None


def spaced(times: list[dt.datetime], rate: float) -> bool:
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(sorted(times))]
    return all(gap >= 1 / rate - ROUNDING_S for gap in gaps)


@given(tenants())
def test_every_send_keeps_both_schedules(
    tenant: tuple[list[Paced], float | None, dt.datetime | None],
) -> None:
    claims, tenant_rate, tenant_first = tenant
    schedule = tenant_schedule(claims, tenant_rate, tenant_first)
    paced = [c for c in claims if tenant_rate is not None or c.destination_rate is not None]
    assert set(schedule.send_at) == {c.id for c in paced}
    if tenant_rate is not None:
        assert tenant_first is not None and schedule.tenant_next_send_at is not None
        times = list(schedule.send_at.values())
        assert spaced(times, tenant_rate)
        assert min(times) >= tenant_first
        assert schedule.tenant_next_send_at >= max(times) + dt.timedelta(seconds=1 / tenant_rate)
    else:
        assert schedule.tenant_next_send_at is None
    for destination, group in itertools.groupby(
            sorted((c for c in claims if c.destination_rate is not None),
                   key=lambda c: c.destination_id), key=lambda c: c.destination_id):
        mine = list(group)
        times = [schedule.send_at[c.id] for c in mine]
        rate = mine[0].destination_rate
        first = mine[0].destination_first_send_at
        assert rate is not None and first is not None
        assert spaced(times, rate)
        assert min(times) >= first
        # In id order, the order they were enqueued in.
        assert times == sorted(times)
        assert schedule.destination_next_send_at[destination] >= (
            max(times) + dt.timedelta(seconds=1 / rate))


def test_a_tenant_rate_alone_spaces_its_claims_from_its_first_send_time() -> None:
    claims = [Paced(n, n % 2) for n in range(4)]
    schedule = tenant_schedule(claims, 10.0, T0)
    assert [schedule.send_at[n] for n in range(4)] == [
        T0 + dt.timedelta(seconds=k / 10) for k in range(4)]
    assert schedule.tenant_next_send_at == T0 + dt.timedelta(seconds=0.4)

"""A tenant's own max_in_flight and rate_limit (claim_limited_tenants.sql, decision 0029),
on the production claim and result path against a real database: the tenant's claims
stay within both over all its destinations, whoever claims, while the rest of each claim
goes to the other tenants; each destination's own limits still hold inside the tenant;
an open breaker still gets its probe; and the slot counter comes back to zero whatever
path gives the slots back. tests/test_cap_counter.py checks the counter against the
rows under concurrent claims, results, releases and reaps."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
from collections import Counter

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.db import queue
from engine.db.queue import BreakerSettings, Claim, EventIn
from engine.maintenance.reaper import reap_expired
from tests.kit import queue_sync
from tests.kit.data import LEASE_MS, add_destination, add_tenant, now
from tests.kit.dbserver import truncate_all
from tests.kit.worker_path import WorkerPath, answer, released

pytestmark = pytest.mark.pg_versions

MAX_ATTEMPTS = 4
# timestamptz and timedelta count microseconds: each send time may be rounded by one.
ROUNDING_S = 2e-6


def backlog(conn: psycopg.Connection, tenant: int, destinations: list[int], events: int) -> None:
    """`events` events of `tenant`, each to one of `destinations` in turn."""
    with conn.transaction():
        queue_sync.enqueue_events(conn, [
            EventIn("t", "{}", [destinations[n % len(destinations)]], tenant_id=tenant)
            for n in range(events)])


def tenant_of(conn: psycopg.Connection) -> dict[int, int]:
    return dict(conn.execute("SELECT id, tenant_id FROM destinations").fetchall())


def counter(conn: psycopg.Connection, tenant: int) -> int:
    row = conn.execute("SELECT in_flight FROM tenants WHERE id = %s", (tenant,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_full_tenant_leaves_the_claim_to_the_others(conn: psycopg.Connection) -> None:
    capped = add_tenant(conn, "capped", max_in_flight=3)
    other = add_tenant(conn, "other")
    capped_destinations = [add_destination(conn, tenant_id=capped) for _ in range(2)]
    backlog(conn, capped, capped_destinations, 40)
    backlog(conn, other, [add_destination(conn, tenant_id=other)], 40)
    owners = tenant_of(conn)

    first = queue_sync.claim_batch(conn, "w:1", 10, LEASE_MS)
    by_tenant = Counter(owners[c.destination_id] for c in first)
    assert by_tenant == {capped: 3, other: 7}
    assert counter(conn, capped) == 3
    # Full: the next claims take none of its deliveries, and all of the others'.
    second = queue_sync.claim_batch(conn, "w:1", 10, LEASE_MS)
    assert Counter(owners[c.destination_id] for c in second) == {other: 10}
    # Its results give the slots back; the next claim takes them again.
    t = now(conn)
    done = [answer(c, 200, t, ()) for c in first if owners[c.destination_id] == capped]
    assert queue_sync.record_results(conn, "w:1", done) == 3
    assert counter(conn, capped) == 0
    third = queue_sync.claim_batch(conn, "w:1", 10, LEASE_MS)
    assert Counter(owners[c.destination_id] for c in third)[capped] == 3


def test_a_destination_keeps_its_own_cap_inside_a_capped_tenant(
    conn: psycopg.Connection,
) -> None:
    tenant = add_tenant(conn, "t", max_in_flight=6)
    small = add_destination(conn, tenant_id=tenant, max_in_flight=1)
    plain = add_destination(conn, tenant_id=tenant)
    backlog(conn, tenant, [small, plain], 40)
    claims = queue_sync.claim_batch(conn, "w:1", 20, LEASE_MS)
    per_destination = Counter(c.destination_id for c in claims)
    assert per_destination[small] == 1
    assert per_destination[plain] == 5
    assert all(c.holds_slot for c in claims if c.destination_id == small)
    row = conn.execute("SELECT in_flight FROM destinations WHERE id = %s", (small,)).fetchone()
    assert row == (1,)


def test_an_open_breaker_in_a_limited_tenant_gets_its_probe(conn: psycopg.Connection) -> None:
    tenant = add_tenant(conn, "t", max_in_flight=5)
    failing = add_destination(conn, tenant_id=tenant)
    backlog(conn, tenant, [failing], 10)
    conn.execute("UPDATE destinations SET breaker = 'open', paused_until = now()"
                 " - interval '1 s', breaker_pause_ms = 1000 WHERE id = %s", (failing,))
    claims = queue_sync.claim_batch(conn, "w:1", 10, LEASE_MS)
    assert len(claims) == 1  # one probe, no more while it is out
    row = conn.execute("SELECT breaker::text FROM destinations WHERE id = %s",
                       (failing,)).fetchone()
    assert row == ("half_open",)
    assert counter(conn, tenant) == 1  # the probe counts under the tenant's cap
    assert queue_sync.claim_batch(conn, "w:1", 10, LEASE_MS) == []


@pytest.mark.parametrize("give_back", ["released", "reaped", "worker exited", "limit removed"])
def test_every_way_back_returns_the_tenant_slots(
    conn: psycopg.Connection, dsn: str, give_back: str,
) -> None:
    tenant = add_tenant(conn, "t", max_in_flight=4)
    backlog(conn, tenant, [add_destination(conn, tenant_id=tenant)], 10)
    path = WorkerPath(dsn, "w:1", lease_ms=LEASE_MS, breaker=BreakerSettings())
    try:
        claims = path.claim(10)
        assert len(claims) == 4 and counter(conn, tenant) == 4
        if give_back == "limit removed":
            # Slots taken under the cap are given back after it is gone.
            conn.execute("UPDATE tenants SET max_in_flight = NULL WHERE id = %s", (tenant,))
        if give_back in ("released", "limit removed"):
            assert path.record([released(c, now(conn)) for c in claims]) == 4
        elif give_back == "reaped":
            conn.execute("UPDATE deliveries SET locked_until = now() - interval '1 s'")
            reap_expired(conn, MAX_ATTEMPTS)
        else:
            queue.release_claims(conn, "w:1", MAX_ATTEMPTS)
    finally:
        path.close()
    assert counter(conn, tenant) == 0
    held = conn.execute("SELECT count(*) FROM deliveries WHERE holds_tenant_slot"
                        " AND status = 'in_flight'").fetchone()
    assert held == (0,)


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rate=st.sampled_from([10.0, 25.0, 60.0]), claimers=st.integers(2, 4),
       limit=st.integers(1, 30), destination_rate=st.one_of(st.none(), st.just(8.0)))
def test_a_rate_limited_tenant_keeps_its_rate_across_claimers(
    conn: psycopg.Connection, dsn: str, rate: float, claimers: int, limit: int,
    destination_rate: float | None,
) -> None:
    """Claimers on their own connections claim the tenant's backlog over two destinations
    (one maybe rate-limited itself) for a while: no two of the tenant's send times are
    closer than 1/rate, none of the limited destination's closer than 1/its rate, and
    the tenant's rate is used while there is backlog."""
    truncate_all(conn)
    tenant = add_tenant(conn, "rated", rate_limit=rate)
    limited = add_destination(conn, tenant_id=tenant, rate_limit=destination_rate)
    plain = add_destination(conn, tenant_id=tenant)
    backlog(conn, tenant, [limited, plain], 600)
    seconds = 1.5
    claims: list[Claim] = []
    failures: list[BaseException] = []
    started = time.monotonic()

    def claimer(name: str) -> None:
        try:
            path = WorkerPath(dsn, name, lease_ms=LEASE_MS, breaker=BreakerSettings())
            try:
                while time.monotonic() - started < seconds:
                    claims.extend(path.claim(limit))
                    time.sleep(0.01)
            finally:
                path.close()
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=claimer, args=(f"w:{n}",)) for n in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert_spaced([c for c in claims], rate)
    if destination_rate is not None:
        assert_spaced([c for c in claims if c.destination_id == limited], destination_rate)
    # The rate is used: the send times of the claiming period are (nearly) all booked.
    times = sorted(c.send_at for c in claims if c.send_at is not None)
    period_end = times[0] + dt.timedelta(seconds=seconds)
    assert sum(1 for t in times if t < period_end) >= 0.8 * rate * seconds


def assert_spaced(claims: list[Claim], rate: float) -> None:
    times = [claim.send_at for claim in claims]
    assert None not in times, "a rate-limited claim without a send time"
    ordered = sorted(t for t in times if t is not None)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ordered)]
    assert not gaps or min(gaps) >= 1 / rate - ROUNDING_S, min(gaps)
    assert min(claim.send_delay_s for claim in claims) >= 0

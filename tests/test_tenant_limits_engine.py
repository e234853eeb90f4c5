"""A tenant's own max_in_flight and rate_limit end to end on the engine's own workers:
`engine --procs 3` against the fake destination, measured where it matters, at the
destination. The tenant's three destinations share one URL name at the fake, so its
counters are the tenant's over all three: the most requests open at once is exactly the
tenant's cap (never more, and reached, across processes), the requests in any 10 s
window stay within rate x 10 + rate (as a destination's, tests/test_rate_limit.py says
why that bound) and use >= 90 % of it. Meanwhile another tenant's backlog is delivered
beside it, and every delivery arrives once.
"""

from __future__ import annotations

from pathlib import Path

import psycopg

from engine.domain import EventIn
from engine.testing.fakedest import FakeDestination
from tests.kit import queue_sync
from tests.kit.data import add_destination, add_tenant, count
from tests.kit.enginerun import wait_until
from tests.kit.workers import engine
from tests.test_rate_limit import WINDOW_MS, window_counts

CAP = 5
ANSWER_MS = 250
CAPPED_EVENTS = 150
PER_WORKER = 3  # --max-in-flight: less than the cap, so reaching it takes two processes
RATE = 20.0
RATED_EVENTS = 300  # 15 s at the rate: a full 10 s window lies inside the backlog
OTHER_EVENTS = 300


def enqueue_spread(conn: psycopg.Connection, tenant: int, destinations: list[int],
                   events: int) -> None:
    with conn.transaction():
        queue_sync.enqueue_events(conn, [
            EventIn("t", f'{{"n": {n}}}', [destinations[n % len(destinations)]],
                    tenant_id=tenant)
            for n in range(events)])


def delivered(conn: psycopg.Connection, tenant: int) -> int:
    return count(conn, "SELECT count(*) FROM finished_deliveries WHERE tenant_id = %s"
                       " AND status = 'delivered'", tenant)


def test_a_tenants_cap_is_exact_across_worker_processes(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    with FakeDestination() as fake, FakeDestination() as other_fake:
        tenant = add_tenant(conn, "capped", max_in_flight=CAP)
        other = add_tenant(conn, "other")
        capped = [add_destination(conn, tenant_id=tenant,
                                  url=fake.url(f"slow/{ANSWER_MS}/tenant"))
                  for _ in range(3)]
        busy = [add_destination(conn, tenant_id=other, url=other_fake.url("fast/other"))]
        with engine(dsn, tmp_path, config, "--procs", "3",
                    "--max-in-flight", str(PER_WORKER)) as run:
            wait_until(lambda: len(run.worker_pids()) == 3, 60, "three workers started")
            enqueue_spread(conn, tenant, capped, CAPPED_EVENTS)
            enqueue_spread(conn, other, busy, OTHER_EVENTS)
            wait_until(lambda: delivered(conn, tenant) == CAPPED_EVENTS, 120,
                       f"{CAPPED_EVENTS} of the capped tenant's deliveries delivered")
            other_done = delivered(conn, other)
        stats = fake.name_stats("tenant")
        assert stats["in_flight"] == 0, stats
    assert stats["max_concurrent"] <= CAP, f"the tenant's cap of {CAP} was exceeded: {stats}"
    assert stats["max_concurrent"] == CAP, f"the tenant's cap was never reached: {stats}"
    assert (stats["delivered_ids"], stats["duplicates"]) == (CAPPED_EVENTS, 0), stats
    # The other tenant was not held behind it: its fast backlog was done well before.
    assert other_done == OTHER_EVENTS
    row = conn.execute("SELECT in_flight FROM tenants WHERE id = %s", (tenant,)).fetchone()
    assert row == (0,)


def test_a_tenants_rate_holds_across_worker_processes(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    with FakeDestination() as fake, FakeDestination() as other_fake:
        tenant = add_tenant(conn, "rated", rate_limit=RATE)
        other = add_tenant(conn, "other")
        rated = [add_destination(conn, tenant_id=tenant, url=fake.url("fast/tenant"))
                 for _ in range(3)]
        busy = [add_destination(conn, tenant_id=other, url=other_fake.url("fast/other"))]
        with engine(dsn, tmp_path, config, "--procs", "3") as run:
            wait_until(lambda: len(run.worker_pids()) == 3, 60, "three workers started")
            enqueue_spread(conn, tenant, rated, RATED_EVENTS)
            enqueue_spread(conn, other, busy, OTHER_EVENTS)
            wait_until(lambda: delivered(conn, tenant) == RATED_EVENTS, 90,
                       "the rated tenant's backlog delivered")
        arrivals = sorted(fake.arrivals("tenant").values())
    assert len(arrivals) == RATED_EVENTS
    assert delivered(conn, other) == OTHER_EVENTS
    windows = window_counts(arrivals)
    assert max(windows) <= RATE * 10 + RATE, max(windows)
    first, last = arrivals[0], arrivals[-1]
    full = [n for start, n in zip(arrivals, windows, strict=True)
            if start + WINDOW_MS <= last]
    assert last - first > WINDOW_MS and full, (first, last)
    assert min(full) >= 0.9 * RATE * 10, (min(full), len(full))
    print(f"densest 10 s window {max(windows)}, thinnest full one {min(full)}")

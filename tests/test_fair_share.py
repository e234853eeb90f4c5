"""Fair share among tenants in the claim (claim_batch.sql, `tenant_walk` and `fair`;
docs/decisions/0026), on the production claim path: queue_async.claim_batch on a worker's
own connection (tests/kit/worker_path.py), against the real database.

The rule checked: when several tenants have due deliveries, a claim of L rows visits the
tenants with pending deliveries round-robin from the worker's cursor, down the tenant
ids, at most max(2, L) of them; the due ones among them, live and not disabled, the
first min(their number, L) of them, each get L / that many rows (the remainder one more
each to the first), or all they have if fewer; the room left goes to the plain scans in
due order. Every tenant with due work is served within ceil(tenants / L) consecutive
claims. A disabled or deleted tenant's deliveries are never claimed, and no claim takes
more than it asked for.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.domain import BreakerSettings, Claim
from tests.kit.data import add_destination
from tests.kit.dbserver import truncate_all
from tests.kit.worker_path import WorkerPath

pytestmark = pytest.mark.pg_versions

EXAMPLES = 60
LEASE_MS = 60_000
NO_BREAKER = BreakerSettings(threshold=1_000_000)
PROPERTY_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@dataclass(frozen=True)
class TenantRows:
    """One tenant's part of an example: its state and its pending deliveries."""

    state: str  # "live", "disabled" or "deleted"
    destinations: int  # 1 or 2; the deliveries alternate between them
    due: int  # pending deliveries due now
    later: int  # pending deliveries due in an hour


tenant_rows = st.builds(
    TenantRows,
    state=st.sampled_from(["live", "live", "live", "live", "disabled", "deleted"]),
    destinations=st.integers(1, 2),
    due=st.integers(0, 12),
    later=st.integers(0, 3),
)


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def worker(dsn: str) -> Iterator[WorkerPath]:
    path = WorkerPath(dsn, "fair-worker", lease_ms=LEASE_MS, breaker=NO_BREAKER)
    yield path
    path.close()


def fill(conn: psycopg.Connection, tenants: Sequence[TenantRows]) -> list[int]:
    """A fresh queue: tenant k (from 0) of `tenants` has id k + 2 (1 is `default`, with
    nothing pending), its destinations and its deliveries, due ones oldest first across
    tenants so that due order alone would serve the lowest tenants. Returns the ids."""
    truncate_all(conn)
    ids: list[int] = []
    for k, tenant in enumerate(tenants):
        row = conn.execute(
            "INSERT INTO tenants (uid, disabled) VALUES (%s, %s) RETURNING id",
            (f"t{k}", tenant.state == "disabled")).fetchone()
        assert row is not None
        tenant_id = int(row[0])
        ids.append(tenant_id)
        destinations = [add_destination(conn, tenant_id=tenant_id)
                        for _ in range(tenant.destinations)]
        for n, due_in in enumerate(["-1 hour"] * tenant.due + ["1 hour"] * tenant.later):
            conn.execute(
                "WITH event AS (INSERT INTO events (type, payload, delivery_count, tenant_id)"
                "               VALUES ('t', '{}', 1, %s) RETURNING id)"
                " INSERT INTO deliveries (event_id, destination_id, tenant_id, next_attempt_at)"
                " SELECT id, %s, %s, now() + %s::interval + %s * interval '1 ms' + %s"
                "        * interval '1 s' FROM event",
                (tenant_id, destinations[n % len(destinations)], tenant_id, due_in, n, k))
        if tenant.state == "deleted":  # as tenant_delete.sql leaves it
            conn.execute("UPDATE tenants SET deleted_at = now() WHERE id = %s", (tenant_id,))
            conn.execute("UPDATE destinations SET deleted_at = now() WHERE tenant_id = %s",
                         (tenant_id,))
    return ids


def claimed_by_tenant(conn: psycopg.Connection, claims: Sequence[Claim]) -> Counter[int]:
    rows = conn.execute("SELECT tenant_id FROM deliveries WHERE id = ANY (%s)",
                        ([c.id for c in claims],)).fetchall()
    assert len(rows) == len(claims)
    return Counter(int(r[0]) for r in rows)


def expected_shares(tenants: Sequence[TenantRows], ids: Sequence[int], limit: int
                    ) -> dict[int, int]:
    """The shares the rule gives, for a new worker (it starts from the highest tenant):
    the tenants with pending deliveries, the first max(2, limit) of them visited; the
    live ones with due work among those, the first min(their number, limit) served."""
    pending = [(i, t) for i, t in zip(ids, tenants, strict=True) if t.due + t.later][::-1]
    visited = pending[:max(2, limit)]
    due = [i for i, t in visited if t.state == "live" and t.due]
    if len(due) < 2:
        return {}
    served = due[:min(len(due), limit)]
    return {tenant: limit // len(served) + (1 if k < limit % len(served) else 0)
            for k, tenant in enumerate(served)}


@PROPERTY_SETTINGS
@given(tenants=st.lists(tenant_rows, min_size=2, max_size=8), limit=st.integers(1, 20))
def test_one_claim_gives_each_tenant_with_due_work_its_share_first(
    db: psycopg.Connection, worker: WorkerPath, tenants: list[TenantRows], limit: int,
) -> None:
    ids = fill(db, tenants)
    worker.tenant_cursor.after = 0
    claims = worker.claim(limit)
    got = claimed_by_tenant(db, claims)
    claimable = {i: t.due for i, t in zip(ids, tenants, strict=True) if t.state == "live"}
    assert len(claims) <= limit
    assert set(got) <= {i for i, due in claimable.items() if due}, "a tenant not to claim for"
    # Work conserving: as much as there is, up to the limit.
    assert len(claims) == min(limit, sum(claimable.values()))
    shares = expected_shares(tenants, ids, limit)
    for tenant, share in shares.items():
        assert got[tenant] >= min(claimable[tenant], share), (tenant, share, got)
    if shares:
        # Nobody beyond its share unless every served tenant has its share or all it had.
        fair_share = math.ceil(limit / len(shares))
        if any(n > fair_share for n in got.values()):
            assert all(got[t] >= min(claimable[t], s) for t, s in shares.items())
        assert worker.tenant_cursor.after == list(shares)[-1]
    # What the worker's claim policy is told (claim_policy.SHARED_CLAIM_CAP).
    assert worker.tenant_cursor.shared == bool(shares and claims)


@PROPERTY_SETTINGS
@given(tenant_count=st.integers(2, 12), limit=st.integers(1, 6), start=st.integers(0, 13))
def test_every_tenant_with_due_work_is_served_within_a_round_of_claims(
    db: psycopg.Connection, worker: WorkerPath, tenant_count: int, limit: int, start: int,
) -> None:
    """Each tenant has more due deliveries than a round takes from it; from any cursor,
    ceil(tenants / limit) consecutive claims serve every one."""
    rounds = math.ceil(tenant_count / limit)
    tenants = [TenantRows("live", 1, limit * rounds + 1, 0)] * tenant_count
    ids = fill(db, tenants)
    worker.tenant_cursor.after = start
    served: set[int] = set()
    for _ in range(rounds):
        claims = worker.claim(limit)
        assert len(claims) == limit
        served |= set(claimed_by_tenant(db, claims))
    assert served == set(ids)


def test_a_noisy_tenants_backlog_does_not_hold_back_anothers_fresh_delivery(
    db: psycopg.Connection, worker: WorkerPath,
) -> None:
    """Tenant A: 2,000 due deliveries an hour old; tenant B: one, just due. Due order
    alone would serve B after the whole backlog; the fair share serves it in the next
    claim, and A still gets the rest of the room."""
    a, b = fill(db, [TenantRows("live", 1, 2_000, 0), TenantRows("live", 1, 0, 0)])
    destination = add_destination(db, tenant_id=b)
    db.execute(
        "WITH event AS (INSERT INTO events (type, payload, delivery_count, tenant_id)"
        "               VALUES ('t', '{}', 1, %s) RETURNING id)"
        " INSERT INTO deliveries (event_id, destination_id, tenant_id)"
        " SELECT id, %s, %s FROM event", (b, destination, b))
    got = claimed_by_tenant(db, worker.claim(50))
    assert got == {a: 49, b: 1}
    assert worker.tenant_cursor.shared


def test_one_tenant_claims_in_due_order_as_before(
    db: psycopg.Connection, worker: WorkerPath,
) -> None:
    """One tenant with due work: no share, the plain scans in due order (the first
    attempt reserve included), and the cursor stays where it was."""
    (only,) = fill(db, [TenantRows("live", 2, 30, 5)])
    worker.tenant_cursor.after = 0
    claims = worker.claim(10)
    oldest = [int(r[0]) for r in db.execute(
        "SELECT id FROM deliveries WHERE tenant_id = %s ORDER BY next_attempt_at LIMIT 10",
        (only,)).fetchall()]
    assert sorted(c.id for c in claims) == sorted(oldest)
    assert worker.tenant_cursor.after == 0
    assert not worker.tenant_cursor.shared


def test_disabled_and_deleted_tenants_get_nothing_even_alone(
    db: psycopg.Connection, worker: WorkerPath,
) -> None:
    disabled, deleted = fill(db, [TenantRows("disabled", 2, 10, 0),
                                  TenantRows("deleted", 1, 10, 0)])
    assert worker.claim(20) == []
    db.execute("UPDATE tenants SET disabled = false WHERE id = %s", (disabled,))
    got = claimed_by_tenant(db, worker.claim(20))
    assert set(got) == {disabled} and deleted not in got

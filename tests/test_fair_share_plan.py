"""Plan tests of the claim's fair share among tenants (claim_batch.sql, `tenant_walk` and
`fair`; docs/decisions/0026) at 10,000 tenants with 3 destinations each: the walk visits
a bounded number of tenants, one index descent each, and each share is an ordered index
scan that stops at the share; nothing reads the queue or the tenants whole, nothing
sorts the backlog; and the claim of tenants with limits of their own
(claim_limited_tenants.sql) beside it. Custom and generic plans, as
tests/test_claim_plan.py checks the rest of the claim; every EXPLAIN ANALYZE is rolled
back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from engine.db import queries
from engine.db.queue import TENANT_LOCK_CLASS
from engine.db.sql_params import (
    ClaimBatchParams,
    ClaimLimitedTenantsParams,
    LockLimitedTenantsParams,
)
from tests.kit.dbserver import DatabaseFactory
from tests.test_claim_plan import (
    LEASE_MS,
    PLAN_MODES,
    Plan,
    cte,
    explain,
    filled_database,
    index_scans,
    nodes,
    report,
    rolled_back,
    seq_scanned,
)

pytestmark = pytest.mark.pg_versions

TENANTS = 10_000
DESTINATIONS_PER_TENANT = 3
BACKLOG = 200_000  # the noisy tenant's due deliveries, older than everyone else's
CLAIM = 50
TYPES = "text, int, int, int, bigint[], bigint[], bigint[], int[], bigint"


def fill(conn: psycopg.Connection) -> None:
    """10,000 tenants (ids 2..10,001) with 3 destinations each and one due delivery per
    destination (30,000), the last ones due first; tenant 1 (`default`) has one
    destination and a backlog of 200,000 deliveries due an hour ago."""
    with conn.transaction():
        conn.execute("INSERT INTO tenants (uid) SELECT 't' || g FROM generate_series(1, %s) g",
                     (TENANTS,))
        conn.execute(
            "INSERT INTO destinations (url, secret, tenant_id)"
            " SELECT 'http://127.0.0.1:9/' || t.id || '/' || k,"
            "        'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', t.id"
            " FROM tenants t, generate_series(1, %s) k ORDER BY t.id, k",
            (DESTINATIONS_PER_TENANT,))
        conn.execute(
            "INSERT INTO events (type, payload, delivery_count, tenant_id)"
            " SELECT 'order.created', '{}', 1, tenant_id FROM destinations ORDER BY id")
        conn.execute(
            "INSERT INTO deliveries (event_id, destination_id, tenant_id, next_attempt_at)"
            " SELECT e.id, e.id, e.tenant_id, now() - e.id * interval '1 ms'"
            " FROM events e")
        conn.execute(
            "INSERT INTO events (type, payload, delivery_count, tenant_id)"
            " SELECT 'order.created', '{}', 1, 1 FROM generate_series(1, %s)", (BACKLOG,))
        conn.execute(
            "INSERT INTO deliveries (event_id, destination_id, tenant_id, next_attempt_at)"
            " SELECT e.id, 1, 1, now() - interval '1 hour' + e.id * interval '1 us'"
            " FROM events e WHERE e.tenant_id = 1")
    conn.execute("VACUUM (ANALYZE) tenants, destinations, events, deliveries")


@pytest.fixture(scope="module")
def tenants_dsn(database_factory: DatabaseFactory) -> Iterator[str]:
    yield from filled_database(database_factory, fill)


@pytest.fixture(name="tx")
def tenants_tx(tenants_dsn: str) -> Iterator[psycopg.Connection]:
    yield from rolled_back(tenants_dsn)


def explain_claim(tx: psycopg.Connection, mode: str, tenant_cursor: int,
                  limit: int = CLAIM) -> Plan:
    params = ClaimBatchParams(
        worker_id="plan-test", limit=limit, first_attempt_reserve=12, lease_ms=LEASE_MS,
        capped_destination_ids=[], destination_ids=[], rate_limited_destination_ids=[],
        tokens=[], tenant_cursor=tenant_cursor)
    return explain(tx, mode, queries.CLAIM_BATCH, TYPES, list(params))


def rows_read(plan: Plan, index: str) -> int:
    return sum(int(s["Actual Rows"] * s["Actual Loops"]) for s in index_scans(plan, index))


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("tenant_cursor", [0, 5_000, TENANTS])
def test_the_walk_visits_as_many_tenants_as_the_claim_has_room_for(
    tx: psycopg.Connection, mode: str, tenant_cursor: int, record_property: Any,
) -> None:
    explained = explain_claim(tx, mode, tenant_cursor)
    report(record_property, f"claim_batch_10k_tenants_after_{tenant_cursor}", mode, explained)
    plan = explained["Plan"]
    assert plan["Actual Rows"] == CLAIM
    walk = cte(explained, "tenant_walk")
    assert walk["Actual Rows"] == CLAIM, "the walk is not bounded by the claim"
    # One descent per tenant visited, each returning the tenant's first pending row.
    assert rows_read(walk, "deliveries_tenant_due_idx") <= CLAIM + 2
    fair = cte(explained, "fair")
    assert fair["Actual Rows"] == CLAIM
    assert rows_read(fair, "deliveries_tenant_due_idx") <= 2 * CLAIM, "read past the shares"
    for name in ("tenant_walk", "fair"):
        node = cte(explained, name)
        scans = index_scans(node, "deliveries_tenant_due_idx")
        assert scans and all(s["Node Type"] in ("Index Scan", "Index Only Scan")
                             for s in scans), (name, scans)
    # The backlog is never sorted, and nothing is read whole: not the queue, not the
    # 10,000 tenants. (destinations: `uncapped_due` may scan it until the first uncapped
    # destination with due work, as before; here it is not run at all.)
    sorted_rows = [n["Actual Rows"] * n["Actual Loops"] for n in nodes(plan)
                   if n["Node Type"] == "Sort"]
    assert max(sorted_rows, default=0) <= CLAIM, f"sorted {max(sorted_rows)} rows"
    assert not seq_scanned(plan) & {"deliveries", "tenants", "events"}
    # Everything went to the shares: the plain scans read nothing.
    for branch in ("eligible_first", "eligible_retry"):
        assert rows_read(cte(explained, branch), "deliveries_claimable_idx") == 0, branch


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_one_tenant_with_due_work_among_many_is_claimed_in_due_order(
    tx: psycopg.Connection, mode: str, record_property: Any,
) -> None:
    """Only the noisy tenant's backlog is due, the 10,000 others have work due later: the
    walk still stops at the claim's size (whether those tenants have due work is one
    descent each), shares nothing, and the plain scans claim in due order."""
    tx.execute("UPDATE deliveries SET next_attempt_at = now() + interval '1 hour'"
               " WHERE tenant_id <> 1")
    tx.execute("ANALYZE deliveries")
    explained = explain_claim(tx, mode, 0)
    report(record_property, "claim_batch_one_tenant_due_of_10k", mode, explained)
    assert explained["Plan"]["Actual Rows"] == CLAIM
    assert cte(explained, "tenant_walk")["Actual Rows"] <= CLAIM
    assert cte(explained, "fair")["Actual Rows"] == 0
    assert cte(explained, "eligible_first")["Actual Rows"] == CLAIM
    assert not seq_scanned(explained["Plan"]) & {"deliveries", "tenants", "events"}


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_a_single_tenant_costs_the_walk_two_descents(
    tx: psycopg.Connection, mode: str, record_property: Any,
) -> None:
    """Nothing pending but the noisy tenant's backlog: the walk finds it and no tenant
    after it, and the claim is the plain scans' as before the fair share."""
    tx.execute("DELETE FROM deliveries WHERE tenant_id <> 1")
    tx.execute("ANALYZE deliveries")
    explained = explain_claim(tx, mode, 0)
    report(record_property, "claim_batch_single_tenant", mode, explained)
    assert explained["Plan"]["Actual Rows"] == CLAIM
    walk = cte(explained, "tenant_walk")
    assert walk["Actual Rows"] == 1
    assert rows_read(walk, "deliveries_tenant_due_idx") == 1
    assert cte(explained, "fair")["Actual Rows"] == 0
    assert cte(explained, "eligible_first")["Actual Rows"] == CLAIM


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_tenants_without_limits_cost_the_limited_claim_one_empty_index_scan(
    tx: psycopg.Connection, mode: str, record_property: Any,
) -> None:
    """lock_limited_tenants.sql, the claim's statement for tenants with limits of their
    own (docs/decisions/0029), with none among the 10,000: it reads tenants_set_aside_idx
    and finds nothing, and never the tenants whole."""
    explained = explain(tx, mode, queries.LOCK_LIMITED_TENANTS, "int, int", list(
        LockLimitedTenantsParams(advisory_lock_class=TENANT_LOCK_CLASS, limit=16)))
    report(record_property, "lock_limited_tenants_none", mode, explained)
    plan = explained["Plan"]
    assert plan["Actual Rows"] == 0
    assert index_scans(plan, "tenants_set_aside_idx")
    assert not seq_scanned(plan)


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_a_capped_tenants_backlog_is_claimed_by_index_up_to_its_room(
    tx: psycopg.Connection, mode: str, record_property: Any,
) -> None:
    """The noisy tenant with a max_in_flight of 20: its lock is one descent of the
    tenants' due index, its claim reads its destination's due rows by index up to its
    room (nothing of the 200,000-row backlog beyond), and claim_batch.sql, bound to what
    is left, shares it among the other tenants without reading the capped backlog."""
    tx.execute("UPDATE tenants SET max_in_flight = 20 WHERE id = 1")
    tx.execute("ANALYZE tenants")
    locked = explain(tx, mode, queries.LOCK_LIMITED_TENANTS, "int, int", list(
        LockLimitedTenantsParams(advisory_lock_class=TENANT_LOCK_CLASS, limit=16)))
    report(record_property, "lock_limited_tenants_one", mode, locked)
    assert locked["Plan"]["Actual Rows"] == 1
    assert not seq_scanned(locked["Plan"]) & {"deliveries", "tenants"}
    claimed = explain(
        tx, mode, queries.CLAIM_LIMITED_TENANTS,
        "text, int, int, bigint[], bigint[], bigint[]", list(ClaimLimitedTenantsParams(
            worker_id="plan-test", limit=CLAIM, lease_ms=LEASE_MS, tenant_ids=[1],
            capped_destination_ids=[], destination_ids=[])))
    report(record_property, "claim_limited_tenants_capped_backlog", mode, claimed)
    plan = claimed["Plan"]
    assert plan["Actual Rows"] == 20
    assert not seq_scanned(plan) & {"deliveries", "tenants", "events", "destinations"}
    assert rows_read(cte(claimed, "picked"), "deliveries_destination_idx") <= 20 + 1
    sorted_rows = [n["Actual Rows"] * n["Actual Loops"] for n in nodes(plan)
                   if n["Node Type"] == "Sort"]
    assert max(sorted_rows, default=0) <= CLAIM, f"sorted {max(sorted_rows)} rows"
    rest = explain_claim(tx, mode, 0, limit=CLAIM - 20)
    report(record_property, "claim_batch_beside_a_capped_tenant", mode, rest)
    assert rest["Plan"]["Actual Rows"] == CLAIM - 20
    assert cte(rest, "fair")["Actual Rows"] == CLAIM - 20
    for branch in ("eligible_first", "eligible_retry"):
        assert rows_read(cte(rest, branch), "deliveries_claimable_idx") == 0, branch

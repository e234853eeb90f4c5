"""Plan regression tests: with a million finished deliveries in the database, the claim, the
result write and the reaper stay on their indexes.

Each statement is planned both ways PostgreSQL may run it: as a custom plan (the first
executions) and as a generic plan (psycopg prepares a statement after a few executions on
one connection, and the server may then switch to a plan that ignores the parameter
values). Every EXPLAIN ANALYZE runs inside a transaction that is rolled back, so the tests
share one big database without changing it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from engine.db import queries, queue, queue_async
from engine.db.queries import Statement
from engine.db.sql_params import (
    ClaimBatchParams,
    LockCappedDestinationsParams,
    RefillSlotsParams,
    ReturnClaimsParams,
)
from tests.kit.dbserver import DatabaseFactory

pytestmark = pytest.mark.pg_versions

FINISHED = 1_000_000
PENDING = 1_000
DESTINATIONS = 10
LEASE_MS = 60_000
PLAN_MODES = ("force_custom_plan", "force_generic_plan")
HISTORY_TABLES = {"finished_deliveries", "events", "delivery_attempts"}

Plan = dict[str, Any]


def fill(conn: psycopg.Connection) -> None:
    """1,000,000 finished deliveries (1 % dead) with their events, then 1,000 due pending
    deliveries: three quarters first attempts, one quarter retries."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO destinations (url, secret)"
            " SELECT 'http://127.0.0.1:9/' || g, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'"
            " FROM generate_series(1, %s) g",
            (DESTINATIONS,),
        )
        conn.execute(
            "INSERT INTO events (id, type, payload, delivery_count, created_at)"
            " OVERRIDING SYSTEM VALUE"
            " SELECT g, 'order.created', '{\"order\": ' || g || '}', 1,"
            "        now() - interval '2 days' + g * interval '100 ms'"
            " FROM generate_series(1, %s) g",
            (FINISHED + PENDING,),
        )
        conn.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), %s)",
                     (FINISHED + PENDING,))
        # Skipping the foreign-key triggers (superuser only) makes this three times faster;
        # every referenced event and destination exists.
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(
            "INSERT INTO finished_deliveries (id, event_id, destination_id, status, attempt,"
            "                                 next_attempt_at, created_at, completed_at, tenant_id)"
            " SELECT g, g, 1 + g %% %s,"
            "        CASE WHEN g %% 100 = 0 THEN 'dead' ELSE 'delivered' END::delivery_status,"
            "        1, t, t, t + interval '1 s', 1"
            " FROM generate_series(1, %s) g,"
            "      LATERAL (SELECT now() - interval '2 days' + g * interval '100 ms' AS t) ts",
            (DESTINATIONS, FINISHED),
        )
        conn.execute("SET LOCAL session_replication_role = origin")
        conn.execute("SELECT setval('delivery_id_seq', %s)", (FINISHED,))
        conn.execute(
            "INSERT INTO deliveries (event_id, destination_id, attempt, next_attempt_at,"
            "                        tenant_id, created_at)"
            " SELECT %s + g, 1 + g %% %s, CASE WHEN g %% 4 = 0 THEN 2 ELSE 0 END,"
            "        now() - interval '10 minutes' + g * interval '100 ms', 1,"
            # A delivery's created_at is its event's (enqueue_events.sql).
            "        now() - interval '2 days' + (%s + g) * interval '100 ms'"
            " FROM generate_series(1, %s) g",
            (FINISHED, DESTINATIONS, FINISHED, PENDING),
        )
    # Not destinations: with fewer than 50 rows autovacuum never analyzes it, so the planner
    # works from a guess there, as it does in most deployments.
    conn.execute("VACUUM (ANALYZE) events, finished_deliveries, deliveries")


def filled_database(
    database_factory: DatabaseFactory, fill: Callable[[psycopg.Connection], None],
) -> Iterator[str]:
    """A new database, `fill`ed, for a module's plan tests; dropped after them."""
    url = database_factory.create()
    with psycopg.connect(url, autocommit=True) as conn:
        fill(conn)
    yield url
    database_factory.drop(url)


def rolled_back(big_dsn: str) -> Iterator[psycopg.Connection]:
    """The `tx` fixture of the plan tests (over their module's `big_dsn`): a connection
    inside one transaction that is rolled back at the end (the queue functions' own
    transactions become savepoints in it). No automatic preparing: psycopg deallocates
    all prepared statements on a rollback, ours included."""
    with (
        psycopg.connect(big_dsn, prepare_threshold=None) as connection,
        connection.transaction(force_rollback=True),
    ):
        yield connection


@pytest.fixture(scope="module")
def big_dsn(database_factory: DatabaseFactory) -> Iterator[str]:
    yield from filled_database(database_factory, fill)


tx = pytest.fixture(rolled_back, name="tx")


def explain(
    conn: psycopg.Connection, mode: str, statement: Statement, types: str, params: list[object],
    runs: int = 3,
) -> Plan:
    """EXPLAIN ANALYZE a prepared `statement` under `plan_cache_mode = mode`, `runs` times,
    each in a savepoint rolled back; returns the last run (warm caches)."""
    conn.execute(sql.SQL("SET LOCAL plan_cache_mode = {}").format(sql.SQL(mode)))
    conn.execute(
        sql.SQL("PREPARE measured ({}) AS {}").format(
            sql.SQL(types), sql.SQL(statement.sql.decode()))
    )
    query = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE measured ({})").format(
        sql.SQL(", ").join(sql.Literal(p) for p in params)
    )
    for _ in range(runs):
        with conn.transaction(force_rollback=True):
            row = conn.execute(query).fetchone()
    conn.execute("DEALLOCATE measured")
    assert row is not None
    document = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return as_parents(conn, dict(document[0]))


def as_parents(conn: psycopg.Connection, explained: Plan) -> Plan:
    """`explained` with each partition (of a history table, schema/026) and each of its
    indexes named as its partitioned parent: the checks name the parents. A partition's own
    name stays in "Partition" (which day a scan read)."""
    parents = dict(conn.execute(
        "SELECT c.relname::text, pg_partition_root(c.oid)::regclass::text FROM pg_class c"
        " WHERE c.relispartition").fetchall())
    for node in nodes(explained["Plan"]):
        read = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
        if node["Node Type"] == "Seq Scan" and not read:
            continue  # an empty partition (a day ahead, the DEFAULT one): nothing read whole
        for key in ("Relation Name", "Index Name"):
            if node.get(key) in parents:
                if key == "Relation Name":
                    node["Partition"] = node[key]
                node[key] = parents[node[key]]
    return explained


def nodes(plan: Plan) -> Iterator[Plan]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def cte(explained: Plan, name: str) -> Plan:
    for node in nodes(explained["Plan"]):
        if node.get("Subplan Name") == f"CTE {name}":
            return node
    raise AssertionError(f"no CTE {name} in the plan")


def index_scans(plan: Plan, index: str) -> list[Plan]:
    return [
        n for n in nodes(plan)
        if n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan")
        and n.get("Index Name") == index
    ]


def seq_scanned(plan: Plan) -> set[str]:
    return {n["Relation Name"] for n in nodes(plan) if n["Node Type"] == "Seq Scan"}


def report(
    record_property: Any, what: str, mode: str, explained: Plan
) -> None:
    ms = float(explained["Execution Time"])
    record_property(f"{what}_{mode}_execution_ms", ms)
    print(f"\n{what} ({mode}): execution {ms:.3f} ms, planning {explained['Planning Time']} ms")


LOCK_CAPPED = LockCappedDestinationsParams(
    advisory_lock_class=queue.CAPPED_CLAIM_LOCK_CLASS, limit=queue.CAPPED_LOCKS_PER_CLAIM)


def claim_params(worker: str, limit: int, capped: list[int]) -> ClaimBatchParams:
    """claim_batch.sql's parameters as the worker's claim binds them, with 12 first
    attempts reserved, `capped` locked, and no destination left out or rate-limited."""
    return ClaimBatchParams(
        worker_id=worker, limit=limit, first_attempt_reserve=12, lease_ms=LEASE_MS,
        capped_destination_ids=capped, destination_ids=[], rate_limited_destination_ids=[],
        tokens=[])


def claim_in(tx: psycopg.Connection, worker: str, limit: int) -> list[queue.Claim]:
    """The claim's statements (queue_async.claim_batch's, no destination here being
    rate-limited) inside `tx`'s transaction, which the test rolls back: the in-flight
    state a plan is measured against."""
    locked = queries.LOCK_CAPPED_DESTINATIONS.run_sync(tx, LOCK_CAPPED).fetchall()
    params = claim_params(worker, limit, [row[0] for row in locked])
    # The last column is the fair share's tenant cursor, not a Claim field.
    rows = [row[:-1] for row in queries.CLAIM_BATCH.run_sync(tx, params).fetchall()]
    return [queue.Claim(*row) for row in queue_async.claim_rows(rows)]


def claim_all(conn: psycopg.Connection, workers: int, prefix: str) -> list[queue.Claim]:
    claims: list[queue.Claim] = []
    for n in range(workers):
        claims += claim_in(conn, f"{prefix}{n}", 50)
    return claims


def assert_reads_no_table_whole(plan: Plan) -> None:
    """No sequential scan of the queue or of a history table."""
    touched = seq_scanned(plan)
    assert not touched & ({"deliveries"} | HISTORY_TABLES), touched


def explain_claim(tx: psycopg.Connection, mode: str) -> Plan:
    params = claim_params("plan-test", 50, [])
    return explain(tx, mode, queries.CLAIM_BATCH, "text, int, int, int, bigint[]", list(params))


def check_branches(explained: Plan, *, ordered: bool) -> None:
    """Both branches lock rows found through deliveries_claimable_idx, matching its
    attempt key (not just the time range); `ordered`: as an ordered Index Scan that stops
    at the limit, with no Sort of everything due."""
    for branch, key in (("eligible_first", "= 0"), ("eligible_retry", "= 1")):
        node = cte(explained, branch)
        assert any(n["Node Type"] == "LockRows" for n in nodes(node)), branch
        scans = index_scans(node, "deliveries_claimable_idx")
        assert scans, f"{branch} does not use deliveries_claimable_idx"
        condition = scans[0]["Index Cond"]
        assert "least" in condition.lower() and key in condition, (branch, condition)
        assert not index_scans(node, "deliveries_destination_idx"), branch
        if ordered:
            assert scans[0]["Node Type"] == "Index Scan", (branch, scans[0]["Node Type"])
            assert not [n for n in nodes(node) if n["Node Type"] == "Sort"], branch


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_claim_scans_the_claimable_index_for_both_branches(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    explained = explain_claim(tx, mode)
    report(record_property, "claim_batch", mode, explained)
    plan = explained["Plan"]
    assert plan["Actual Rows"] == 50
    for branch in ("eligible_first", "eligible_retry"):
        assert cte(explained, branch)["Actual Rows"] > 0, f"{branch}: the test data is wrong"
    # 1,000 rows: reading the due range whole through the index and sorting it is fine.
    check_branches(explained, ordered=False)
    assert index_scans(cte(explained, "claimed"), "deliveries_pkey")
    assert_reads_no_table_whole(plan)


BURST = 20_000


def add_burst(tx: psycopg.Connection) -> None:
    """20,000 more first attempts, due now (their events exist already)."""
    tx.execute(
        "INSERT INTO deliveries (event_id, destination_id, tenant_id, created_at)"
        " SELECT e.id, 1 + e.id %% %s, 1, e.created_at FROM events e WHERE e.id <= %s",
        (DESTINATIONS, BURST),
    )


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("situation", ["no_retries", "stale_statistics"])
def test_claim_stays_an_ordered_scan_on_a_large_queue(
    tx: psycopg.Connection, mode: str, situation: str, record_property: Any
) -> None:
    if situation == "no_retries":
        # A healthy queue: nothing to retry, and the statistics know it.
        tx.execute("UPDATE deliveries SET attempt = 0")
        add_burst(tx)
        tx.execute("ANALYZE deliveries")
    else:
        # A burst of new events after an ANALYZE that saw only retries pending.
        tx.execute("UPDATE deliveries SET attempt = 2")
        tx.execute("ANALYZE deliveries")
        add_burst(tx)
    explained = explain_claim(tx, mode)
    report(record_property, f"claim_batch_{situation}", mode, explained)
    assert explained["Plan"]["Actual Rows"] == 50
    check_branches(explained, ordered=True)
    assert_reads_no_table_whole(explained["Plan"])


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_a_capped_claim_reads_only_the_room_under_its_cap(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    """A capped destination with a deep backlog: its branch of the claim scans its due
    deliveries in order and stops at the room under the cap, instead of reading (and
    sorting) every pending row of the destination on every claim."""
    tx.execute("UPDATE destinations SET max_in_flight = 5 WHERE id = 1")
    add_burst(tx)  # destination 1 now has 2,100 due deliveries
    tx.execute("ANALYZE deliveries")
    params = claim_params("plan-test", 50, [1])
    explained = explain(tx, mode, queries.CLAIM_BATCH, "text, int, int, int, bigint[]",
                        list(params))
    report(record_property, "claim_batch_capped", mode, explained)
    capped = cte(explained, "capped")
    assert capped["Actual Rows"] == 5
    assert not [n for n in nodes(capped) if n["Node Type"] == "Sort"], "sorted the backlog"
    scans = index_scans(capped, "deliveries_destination_idx")
    assert scans and all(s["Node Type"] == "Index Scan" for s in scans), scans
    assert max(s["Actual Rows"] for s in scans) <= 10, "read past the room under the cap"


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_a_slot_refill_reads_only_the_slots_it_refills(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    """The refill of a capped destination with a deep backlog reads its due deliveries in
    order and stops at the slots given back and the spares, as the capped claim does."""
    tx.execute("UPDATE destinations SET max_in_flight = 5 WHERE id = 1")
    add_burst(tx)  # destination 1 now has 2,100 due deliveries
    tx.execute("ANALYZE deliveries")
    mine = [c for c in claim_in(tx, "plan-test", 50)
            if c.destination_id == 1]
    assert len(mine) == 5
    started = tx.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    results = [queue.Result(c.id, c.attempt, "delivered", started, 3, 200, None, None, None,
                            c.claim_token) for c in mine]
    # In the top-level transaction, not a savepoint: refill_slots.sql refills only the
    # destinations whose rows this transaction wrote.
    queries.RECORD_RESULTS.run_sync(
        tx, queue_async.record_params("plan-test", results, None, [1]))
    params = list(RefillSlotsParams(worker_id="plan-test", lease_ms=LEASE_MS,
                                    destination_ids=[1], slots=[5], spares=[3]))
    explained = explain(tx, mode, queries.REFILL_SLOTS, "text, int, bigint[], int[], int[]",
                        params)
    report(record_property, "refill_slots", mode, explained)
    assert cte(explained, "claimed")["Actual Rows"] == 5 + 3  # the slots, then the spares
    plan = explained["Plan"]
    # The only sort numbers the rows picked (slot takers first), never the backlog.
    sorted_scans = [s for n in nodes(plan) if n["Node Type"] == "Sort"
                    for s in nodes(n) if s.get("Relation Name") == "deliveries"]
    assert not sorted_scans, "sorted the backlog"
    scans = index_scans(plan, "deliveries_destination_idx")
    assert scans and all(s["Node Type"] == "Index Scan" for s in scans), scans
    assert max(s["Actual Rows"] for s in scans) <= 10, "read past the slots refilled"
    assert_reads_no_table_whole(plan)


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_record_results_finds_its_rows_by_primary_key(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    # Most of the queue in flight, as under load: 19 workers holding 50 each.
    claim_all(tx, 18, "busy")
    mine = claim_in(tx, "plan-test", 50)
    tx.execute("ANALYZE deliveries")
    started = tx.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    later = started + dt.timedelta(minutes=5)
    outcomes = ["delivered", "retry", "dead"]
    results = [
        queue.Result(
            c.id, c.attempt, outcomes[i % 3], started, 12,
            200 if i % 3 == 0 else 500,
            None if i % 3 == 0 else "HTTP 500",
            "ok",
            later if i % 3 == 1 else None,
        )
        for i, c in enumerate(mine)
    ]
    params = list(queue_async.record_params("plan-test", results))
    types = "text, json, int, int, int, int"
    explained = explain(tx, mode, queries.RECORD_RESULTS, types, params)
    report(record_property, "record_results", mode, explained)
    assert explained["Plan"]["Actual Rows"] == 1
    for step in ("finished", "requeued"):
        node = cte(explained, step)
        assert node["Actual Rows"] > 0, step
        assert index_scans(node, "deliveries_pkey"), f"{step} does not use deliveries_pkey"
    assert_reads_no_table_whole(explained["Plan"])


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_reaper_scans_only_in_flight_rows(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    claim_all(tx, 2, "host")
    tx.execute(
        "UPDATE deliveries SET locked_until = now() - interval '1 minute'"
        " WHERE locked_by = 'host0'"
    )
    tx.execute("ANALYZE deliveries")
    explained = explain(
        tx, mode, queries.RETURN_CLAIMS, "text, bool, text, int, int",
        list(ReturnClaimsParams(
            locked_by=None, only_expired=True, reason="lease expired", max_attempts=10,
            batch_limit=queue.RETURN_BATCH, advisory_lock_class=queue.BREAKER_LOCK_CLASS,
            tenant_advisory_lock_class=queue.TENANT_LOCK_CLASS)),
    )
    report(record_property, "reap_expired", mode, explained)
    lost = cte(explained, "lost")
    assert lost["Actual Rows"] == 50
    assert any(n["Node Type"] == "LockRows" for n in nodes(lost))
    assert index_scans(lost, "deliveries_in_flight_idx"), "the reaper reads the whole queue"
    touched = seq_scanned(explained["Plan"])
    assert not touched & HISTORY_TABLES, touched


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_a_claim_with_only_capped_work_skips_the_plain_scans(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    """Every destination capped, 21,000 deliveries due: the capped branch takes the room
    under each cap, and the plain scans (which could only drop capped rows after their
    join) read nothing of deliveries_claimable_idx instead of walking the whole backlog."""
    tx.execute("UPDATE destinations SET max_in_flight = 5")
    add_burst(tx)
    tx.execute("ANALYZE deliveries")
    params = claim_params("plan-test", 100, list(range(1, DESTINATIONS + 1)))
    explained = explain(tx, mode, queries.CLAIM_BATCH, "text, int, int, int, bigint[]",
                        list(params))
    report(record_property, "claim_batch_all_capped", mode, explained)
    assert explained["Plan"]["Actual Rows"] == 5 * DESTINATIONS
    for branch in ("eligible_first", "eligible_retry"):
        read = sum(s["Actual Rows"] * s["Actual Loops"]
                   for s in index_scans(cte(explained, branch), "deliveries_claimable_idx"))
        assert read == 0, f"{branch} walked {read} rows of capped destinations"


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_a_claim_filled_by_capped_destinations_locks_no_other_rows(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    """Half the destinations capped far above the claim, all with work due: the capped
    branch fills the claim, and the scan of the others' first attempts locks nothing.
    Rows it locked beyond the room would stay locked, unclaimed, until the commit, and
    every other claimer would skip them."""
    capped = list(range(1, DESTINATIONS // 2 + 1))
    tx.execute("UPDATE destinations SET max_in_flight = 1000 WHERE id = ANY(%s)", (capped,))
    add_burst(tx)
    tx.execute("ANALYZE deliveries")
    params = claim_params("plan-test", 100, capped)
    explained = explain(tx, mode, queries.CLAIM_BATCH, "text, int, int, int, bigint[]",
                        list(params))
    report(record_property, "claim_batch_filled_by_capped", mode, explained)
    assert explained["Plan"]["Actual Rows"] == 100
    for branch in ("eligible_first", "eligible_retry"):
        locked = cte(explained, branch)["Actual Rows"]
        assert locked == 0, f"{branch} locked {locked} rows the claim had no room for"


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("situation", ["analyzed", "stale_statistics"])
def test_locking_capped_destinations_probes_each_one_not_the_backlog(
    tx: psycopg.Connection, mode: str, situation: str, record_property: Any
) -> None:
    """The first statement of every claim, every destination capped, one with 2,100
    deliveries due and the others with work due only later: it looks for one due
    delivery per capped destination with room, by its index, instead of reading the due
    backlog to learn which destinations have any (19,500 rows and 11 ms per claim in
    bench many-destinations; 26 ms in capped-slow, 2026-12-04)."""
    tx.execute("UPDATE destinations SET max_in_flight = 5")
    add_burst(tx)
    later = "UPDATE deliveries SET next_attempt_at = now() + interval '1 hour'"
    if situation == "analyzed":
        tx.execute(later + " WHERE destination_id <> 1")
        tx.execute("ANALYZE deliveries")
    else:
        # Analyzed while nothing was due yet, as a bench backlog or a wave of retries
        # is: the planner expects about one due row.
        tx.execute(later)
        tx.execute("ANALYZE deliveries")
        tx.execute("UPDATE deliveries SET next_attempt_at = now() - interval '1 minute'"
                   " WHERE destination_id = 1")
    explained = explain(tx, mode, queries.LOCK_CAPPED_DESTINATIONS, "int, int",
                        list(LOCK_CAPPED))
    report(record_property, f"lock_capped_destinations_{situation}", mode, explained)
    assert explained["Plan"]["Actual Rows"] == 1
    read = sum(n["Actual Rows"] * n["Actual Loops"] for n in nodes(explained["Plan"])
               if n.get("Relation Name") == "deliveries")
    assert read <= DESTINATIONS, f"read {read} deliveries to find 1 destination with work"


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_locking_capped_destinations_stops_probing_once_it_has_enough(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    """With more capped destinations that have work than a claim locks, it probes about
    as many as it locks, in a random order, instead of probing every one before picking
    (500 capped destinations: 4.4 ms per claim, bench many-destinations, 2026-12-04)."""
    many = 4 * queue.CAPPED_LOCKS_PER_CLAIM
    tx.execute(
        "INSERT INTO destinations (url, secret)"
        " SELECT 'http://127.0.0.1:9/more/' || g, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'"
        " FROM generate_series(1, %s) g", (many - DESTINATIONS,))
    tx.execute("UPDATE destinations SET max_in_flight = 5")
    tx.execute("INSERT INTO deliveries (event_id, destination_id, tenant_id, created_at)"
               " SELECT d.id, d.id, d.tenant_id, e.created_at"
               " FROM destinations d JOIN events e ON e.id = d.id")
    tx.execute("ANALYZE destinations, deliveries")
    explained = explain(tx, mode, queries.LOCK_CAPPED_DESTINATIONS, "int, int",
                        list(LOCK_CAPPED))
    report(record_property, "lock_capped_destinations_many", mode, explained)
    assert explained["Plan"]["Actual Rows"] == queue.CAPPED_LOCKS_PER_CLAIM
    probes = max(n["Actual Loops"] for n in nodes(explained["Plan"])
                 if n.get("Relation Name") == "deliveries")
    assert probes == queue.CAPPED_LOCKS_PER_CLAIM, (
        f"probed {probes} of {many} destinations to lock {queue.CAPPED_LOCKS_PER_CLAIM}")


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_a_claim_asks_whether_a_destination_has_due_work_from_its_newest_row(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    """The claim's two questions of whether a destination has due work (a probe for an
    open breaker, `probed_destinations`; any uncapped one for the plain scans,
    `uncapped_due`) are one backward descent of deliveries_destination_idx from now()
    per destination asked. A backlog is claimed oldest first, and the entries of the rows
    claimed since the last vacuum stay at the old end of each destination's range: a
    forward scan, or a hash semi-join over a sequential scan of deliveries (the heap's
    front is those rows), stepped over all of them on every claim (3,000-6,800 buffers
    for a claim of 8 in noisy-neighbour, docs/decisions/0038)."""
    tx.execute("UPDATE destinations SET breaker = 'open', paused_until = now() - interval '1 s'"
               " WHERE id = 2")
    add_burst(tx)
    # The old end of the backlog claimed, as a drain leaves it between vacuums.
    tx.execute("UPDATE deliveries SET status = 'in_flight', locked_by = 'other',"
               " locked_until = now() + interval '1 minute'"
               " WHERE id IN (SELECT id FROM deliveries ORDER BY next_attempt_at LIMIT 10000)")
    tx.execute("ANALYZE deliveries")
    explained = explain(tx, mode, queries.CLAIM_BATCH, "text, int, int, int, bigint[]",
                        list(claim_params("plan-test", 50, [])))
    report(record_property, "claim_batch_due_probes", mode, explained)
    assert explained["Plan"]["Actual Rows"] == 50
    assert cte(explained, "probed_destinations")["Actual Rows"] == 1
    for probing in ("probed_destinations", "uncapped_due"):
        read = [n for n in nodes(cte(explained, probing))
                if n.get("Relation Name") == "deliveries"]
        assert read, f"{probing}: no probe of deliveries in the plan"
        for scan in read:
            assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), (probing, scan)
            assert scan["Index Name"] == "deliveries_destination_idx", (probing, scan)
            assert scan["Scan Direction"] == "Backward", (probing, scan["Scan Direction"])
            assert scan["Actual Rows"] <= 1, (probing, scan["Actual Rows"])

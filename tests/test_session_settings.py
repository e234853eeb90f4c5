"""The engine's own sessions never JIT-compile a hot statement, whatever the server's and
the database's JIT settings, in custom and in generic plans.

The database is set up the way that makes JIT compile anything it is allowed to
(`jit = on`, every `jit_*_above_cost = 0`): on a test database the real thresholds are
rarely reached, so a test at stock thresholds could not fail. The same statements on a
plain connection to the same database must show JIT, or the test proves nothing; servers
that cannot JIT at all (the embedded PostgreSQL 18) skip it, unless ENGINE_REQUIRE_JIT=1
says the server must have JIT: CI runs it so on PostgreSQL 15, whose JIT is on.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from engine.config import Settings
from engine.db import queries, queue, queue_async
from engine.db.database import open_database, worker_dsn
from engine.db.queries import Statement
from engine.db.sql_params import (
    BreakerDeferParams,
    ClaimBatchParams,
    LockCappedDestinationsParams,
    PartitionsDroppableParams,
    PayloadSweepParams,
    RefillSlotsParams,
    ReplayDeadParams,
    ReturnClaimsParams,
    TenantDeliveryParams,
)
from engine.observe.oplog import Outage
from engine.observe.status import collect_status
from engine.worker.connection import connect
from engine.worker.loop import DeliveryWorker
from tests.kit import queue_sync

pytestmark = pytest.mark.pg_versions

PLAN_MODES = ("force_custom_plan", "force_generic_plan")
LEASE_MS = 60_000
MAX_ATTEMPTS = 10


@pytest.fixture
def jit_everything(dsn: str) -> Iterator[str]:
    """`dsn`'s database with JIT on and every JIT threshold at 0, for every new session."""
    name = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for setting, value in (("jit", "on"), ("jit_above_cost", "0"),
                               ("jit_inline_above_cost", "0"),
                               ("jit_optimize_above_cost", "0")):
            conn.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        available = conn.execute("SELECT pg_jit_available()").fetchone()
    if not (available and available[0]):
        if os.environ.get("ENGINE_REQUIRE_JIT") == "1":
            pytest.fail("ENGINE_REQUIRE_JIT=1, but this server cannot JIT-compile "
                        "(pg_jit_available() is false: is its llvmjit package installed?)")
        pytest.skip("this server cannot JIT-compile (no JIT provider), so nothing to prevent")
    yield dsn


def fill(conn: psycopg.Connection) -> dict[str, Any]:
    """Capped and uncapped destinations with due deliveries, some claimed (for the result
    write and the reaper), one open breaker (for breaker_defer), one dead delivery."""
    with conn.transaction():
        dests = [row[0] for row in conn.execute(
            "INSERT INTO destinations (url, secret, max_in_flight)"
            " SELECT 'http://127.0.0.1:9/' || g, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',"
            "        CASE WHEN g % 2 = 0 THEN 5 END"
            " FROM generate_series(1, 6) g RETURNING id").fetchall()]
        queue_sync.enqueue_events(conn, [
            queue.EventIn("order.created", json.dumps({"n": n}), [dests[n % len(dests)]])
            for n in range(60)])
    claims = queue_sync.claim_batch(conn, "jit-test", 20, LEASE_MS)
    assert claims, "the test data is wrong: nothing to claim"
    with conn.transaction():
        conn.execute("UPDATE destinations SET breaker = 'open',"
                     " paused_until = now() + interval '1 hour' WHERE id = %s", (dests[0],))
    started = dt.datetime.now(dt.UTC)
    dead = queue_sync.claim_batch(conn, "jit-dead", 1, LEASE_MS)
    queue_sync.record_results(conn, "jit-dead", [
        queue.Result(c.id, c.attempt, "dead", started, 5, 500, "HTTP 500") for c in dead])
    conn.execute("ANALYZE")
    return {"claims": claims, "destinations": dests, "started": started}


def hot_statements(data: dict[str, Any]) -> list[tuple[str, Statement, Sequence[object]]]:
    """(name, statement, parameters) of every statement on the delivery path and in
    maintenance, with the parameters the engine would pass."""
    claims: list[queue.Claim] = data["claims"]
    started: dt.datetime = data["started"]
    later = started + dt.timedelta(minutes=5)
    outcomes = ("delivered", "retry", "dead", "released")
    results = [
        queue.Result(c.id, c.attempt, outcomes[i % 4], started, 12, 200, "HTTP 500", "ok",
                     later if outcomes[i % 4] == "retry" else None)
        for i, c in enumerate(claims)]
    events = [queue.EventIn("order.created", '{"n": 1}', data["destinations"][1:3]),
              queue.EventIn("order.created", '{"n": 2}')]
    cutoff = started + dt.timedelta(days=1)
    capped = data["destinations"][1::2]

    def returned(locked_by: str | None, only_expired: bool, reason: str
                 ) -> ReturnClaimsParams:
        return ReturnClaimsParams(
            locked_by=locked_by, only_expired=only_expired, reason=reason,
            max_attempts=MAX_ATTEMPTS, batch_limit=queue.RETURN_BATCH,
            advisory_lock_class=queue.BREAKER_LOCK_CLASS,
            tenant_advisory_lock_class=queue.TENANT_LOCK_CLASS)

    return [
        ("lock_capped_destinations", queries.LOCK_CAPPED_DESTINATIONS,
         LockCappedDestinationsParams(advisory_lock_class=queue.CAPPED_CLAIM_LOCK_CLASS,
                                      limit=queue.CAPPED_LOCKS_PER_CLAIM)),
        ("claim_batch", queries.CLAIM_BATCH, ClaimBatchParams(
            worker_id="jit-test-2", limit=50, first_attempt_reserve=12, lease_ms=LEASE_MS,
            capped_destination_ids=capped, destination_ids=[],
            rate_limited_destination_ids=[], tokens=[])),
        ("record_results", queries.RECORD_RESULTS,
         queue_async.record_params("jit-test", results)),
        ("refill_slots", queries.REFILL_SLOTS, RefillSlotsParams(
            worker_id="jit-test", lease_ms=LEASE_MS, destination_ids=capped,
            slots=[2] * len(capped), spares=[0] * len(capped))),
        ("release_claims", queries.RETURN_CLAIMS, returned("jit-test", False, "worker exited")),
        ("reap_expired", queries.RETURN_CLAIMS, returned(None, True, "lease expired")),
        ("enqueue_events", queries.ENQUEUE_EVENTS, queue_async.enqueue_params(events)),
        ("breaker_defer", queries.BREAKER_DEFER, BreakerDeferParams(batch_limit=100)),
        ("partitions_droppable", queries.PARTITIONS_DROPPABLE,
         PartitionsDroppableParams(cutoff=cutoff, table="events")),
        ("payload_sweep_events", queries.PAYLOAD_SWEEP_EVENTS,
         PayloadSweepParams(lower=None, upper=cutoff, after_id=0, batch_limit=100)),
        ("replay_dead", queries.REPLAY_DEAD, ReplayDeadParams(
            destination_id=data["destinations"][0], since=None, until=cutoff,
            batch_limit=100)),
        ("replay_delivery", queries.REPLAY_DELIVERY,
         TenantDeliveryParams(delivery_id=claims[0].id, tenant_id=1)),
        ("metrics_gauges", queries.METRICS_GAUGES, ()),
    ]


def explain(conn: psycopg.Connection, mode: str, statement: Statement,
            params: Sequence[object]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, FORMAT JSON) of `statement` prepared (the server infers the
    parameter types, as psycopg's automatic prepare lets it) and executed once under
    `plan_cache_mode = mode`, in a transaction that is rolled back."""
    with conn.transaction(force_rollback=True):
        conn.execute(sql.SQL("SET LOCAL plan_cache_mode = {}").format(sql.SQL(mode)))
        conn.execute(sql.SQL("PREPARE measured AS {}").format(sql.SQL(statement.sql.decode())))
        arguments = sql.SQL("")
        if params:
            arguments = sql.SQL("({})").format(
                sql.SQL(", ").join(sql.Literal(p) for p in params))
        row = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE measured {}")
                           .format(arguments)).fetchone()
        conn.execute("DEALLOCATE measured")
    assert row is not None
    document = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return dict(document[0])


def jit_compiled(conn: psycopg.Connection, data: dict[str, Any]) -> list[str]:
    """`name (mode)` of every hot statement whose plan was JIT-compiled on `conn`."""
    compiled = []
    for name, statement, params in hot_statements(data):
        for mode in PLAN_MODES:
            explained = explain(conn, mode, statement, params)
            if explained.get("JIT", {}).get("Functions", 0) > 0:
                compiled.append(f"{name} ({mode})")
    return compiled


@pytest.mark.needs_jit
def test_no_hot_statement_is_jit_compiled_on_engine_sessions(jit_everything: str) -> None:
    with psycopg.connect(jit_everything, autocommit=True) as plain:
        data = fill(plain)
        # Without the engine's session settings, this database compiles every statement:
        # what the assertion below rules out is really there to rule out.
        assert len(jit_compiled(plain, data)) == 2 * len(hot_statements(data))
    database = open_database(Settings(dsn=jit_everything))
    with psycopg.connect(database.dsn, autocommit=True) as engine_session:
        assert jit_compiled(engine_session, data) == []


@pytest.mark.needs_jit
def test_worker_connections_get_the_session_settings(jit_everything: str) -> None:
    """The delivery workers and ingress connect asynchronously, from the same conninfo."""
    database = open_database(Settings(dsn=jit_everything))

    async def jit_on_async_connection() -> tuple[Any, ...] | None:
        async with await psycopg.AsyncConnection.connect(database.dsn,
                                                         autocommit=True) as conn:
            return await (await conn.execute("SELECT pg_jit_available()")).fetchone()

    assert asyncio.run(jit_on_async_connection()) == (False,)


@pytest.mark.needs_jit
def test_options_of_the_dsn_and_pgoptions_are_kept(
    jit_everything: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGOPTIONS", "-c work_mem=7MB")
    database = open_database(Settings(dsn=jit_everything))
    with psycopg.connect(database.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT current_setting('work_mem'), pg_jit_available()"
                            ).fetchone() == ("7MB", False)
    # An operator's explicit choice in the DSN comes after ours, and wins.
    explicit = database.dsn.replace("options='-c jit=off -c work_mem=7MB'",
                                    "options='-c jit=on'")
    database = open_database(Settings(dsn=explicit))
    with psycopg.connect(database.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT pg_jit_available()").fetchone() == (True,)


@pytest.mark.needs_jit
def test_status_warns_when_jit_stays_on_for_the_engine(jit_everything: str) -> None:
    # A plain connection stands for a pooler that dropped the engine's startup options.
    with psycopg.connect(jit_everything, autocommit=True) as plain:
        warned = collect_status(plain)["warnings"]
    assert any(w.startswith("JIT is on in the engine's sessions") for w in warned)
    database = open_database(Settings(dsn=jit_everything))
    with psycopg.connect(database.dsn, autocommit=True) as engine_session:
        status = collect_status(engine_session)
    assert status["settings"]["jit"] is False
    assert not [w for w in status["warnings"] if "JIT" in w]


def test_status_warns_about_synchronous_commit_off(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=off") as conn:
        warned = collect_status(conn)["warnings"]
    assert any(w.startswith("synchronous_commit is off") for w in warned)
    # (The tests' embedded server runs with it off, for speed.)
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
        assert not [w for w in collect_status(conn)["warnings"] if "synchronous_commit" in w]


def test_queue_sessions_use_generic_plans_unless_the_dsn_says_otherwise(dsn: str) -> None:
    """A worker's claim and result connections plan their prepared statements once
    (docs/decisions/0018-generic-plans-on-queue-sessions.md); an operator's
    plan_cache_mode in the DSN comes after ours and wins."""
    async def settings_of(url: str) -> tuple[Any, ...] | None:
        conn = await connect(url, "settings-test", listen=False, outage=Outage("test"),
                             give_up=lambda: None)
        async with conn:
            return await (await conn.execute(
                "SELECT current_setting('plan_cache_mode'),"
                "       current_setting('idle_in_transaction_session_timeout')")).fetchone()

    assert asyncio.run(settings_of(dsn)) == ("force_generic_plan", "5s")
    explicit = make_conninfo(dsn, options="-c plan_cache_mode=auto")
    assert asyncio.run(settings_of(explicit)) == ("auto", "5s")


def test_worker_sessions_commit_without_waiting_for_the_disk_unless_told(dsn: str) -> None:
    """A worker's claims and results commit with synchronous_commit off (a lost one is
    sent again, docs/decisions/0037); `worker_synchronous_commit` or the DSN's own
    options turn it back on."""
    async def setting_of(url: str) -> str:
        conn = await connect(url, "settings-test", listen=False, outage=Outage("test"),
                             give_up=lambda: None)
        async with conn:
            row = await (await conn.execute(
                "SELECT current_setting('synchronous_commit')")).fetchone()
        assert row is not None
        return str(row[0])

    # The tests' server runs with it off, for speed: this database says on, as a stock
    # server does.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(
            sql.Identifier(conninfo_to_dict(dsn)["dbname"])))
    assert asyncio.run(setting_of(worker_dsn(dsn, False))) == "off"
    assert asyncio.run(setting_of(worker_dsn(dsn, True))) == "on"
    # An operator's choice in the DSN comes after ours, and wins.
    explicit = make_conninfo(dsn, options="-c synchronous_commit=remote_write")
    assert asyncio.run(setting_of(worker_dsn(explicit, False))) == "remote_write"
    assert DeliveryWorker(Settings(dsn=dsn), dsn).dsn == worker_dsn(dsn, False)


def test_a_result_that_finishes_an_ordered_delivery_waits_for_the_disk(dsn: str) -> None:
    """Finishing a delivery with an ordering key lets the next of its key go: that
    commit waits for the disk whatever the worker session says (record_results.sql,
    ordered_waits); a batch of unordered ones does not."""
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=off") as conn:
        dests = [conn.execute("INSERT INTO destinations (url, secret, ordered) VALUES"
                              " ('http://127.0.0.1:9/', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',"
                              " %s) RETURNING id", (ordered,)).fetchone()
                 for ordered in (False, True)]
        with conn.transaction():
            queue_sync.enqueue_events(conn, [
                queue.EventIn("t", "{}", [row[0]], ordering_key="k") for row in dests if row])
        claims = queue_sync.claim_batch(conn, "w", 10, LEASE_MS)
        ordered = conn.execute("SELECT id FROM deliveries WHERE ordering_key = 'k'"
                               ).fetchone()
        assert len(claims) == 2 and ordered is not None
        at = dt.datetime.now(dt.UTC)
        for claim, waits in sorted(((c, c.id == ordered[0]) for c in claims),
                                   key=lambda pair: pair[1]):
            result = queue.Result(claim.id, claim.attempt, "delivered", at, 1, 200,
                                  claim_token=claim.claim_token)
            with conn.transaction():
                row = queries.RECORD_RESULTS.run_sync(
                    conn, queue_async.record_params("w", [result])).fetchone()
                setting = conn.execute("SELECT current_setting('synchronous_commit')"
                                       ).fetchone()
            assert row is not None and row[0] == 1 and row[-1] is waits
            assert setting == ("on" if waits else "off",)

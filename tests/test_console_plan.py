"""Plan tests for the console's reads: with a million finished deliveries (each with its
attempt and its event) every statement behind a console request stays on its indexes and
reads no history table whole, in custom and generic plans alike (see test_claim_plan.py
for the method). The last test times each console request over HTTP against the same
database and prints the table (timings are reported, not asserted: the machine is shared).

The history is spread 100 ms apart (10 deliveries a second for 28 hours), so the last hour
holds 36,000 attempts. The per-minute chart and the destinations' windows read none of
them: they read the per-minute rollup (delivery_minutes, schema/011), filled here as the
migration's backfill fills it, one row per minute and destination (600 for the last hour,
1,440 for one destination's day), whatever the delivery rate.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine.db import queries
from engine.db.queries import Statement
from engine.testing.ingress_server import IngressProcess
from tests.kit.dbserver import DatabaseFactory
from tests.test_claim_plan import (
    HISTORY_TABLES,
    PLAN_MODES,
    Plan,
    as_parents,
    explain,
    filled_database,
    nodes,
    rolled_back,
    seq_scanned,
)

pytestmark = pytest.mark.pg_versions

FINISHED = 1_000_000
PENDING = 1_000
DESTINATIONS = 10
STEP = "100 ms"  # between consecutive deliveries of the history
TYPES = 20  # event types, round robin: 'type.0' .. 'type.19'


# The migration's backfill of the rollup from the attempts (its last statement).
ROLLUP_BACKFILL = "INSERT INTO delivery_minutes" + (
    Path(__file__).resolve().parents[1] / "schema" / "011_delivery_minutes.sql"
).read_text().split("INSERT INTO delivery_minutes", 1)[1]


def fill(conn: psycopg.Connection) -> None:
    """1,000,000 finished deliveries (1 % dead) with one attempt and one event each, then
    1,000 pending deliveries (a quarter retrying, with an attempt each)."""
    total = FINISHED + PENDING
    with conn.transaction():
        conn.execute(
            "INSERT INTO destinations (url, secret)"
            " SELECT 'http://127.0.0.1:9/' || g, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'"
            " FROM generate_series(1, %s) g", (DESTINATIONS,))
        conn.execute(
            "INSERT INTO events (id, type, payload, delivery_count, created_at)"
            " OVERRIDING SYSTEM VALUE"
            " SELECT g, 'type.' || g %% %s, '{\"n\": ' || g || '}', 1,"
            f"        now() - %s * interval '{STEP}' + g * interval '{STEP}'"
            " FROM generate_series(1, %s) g", (TYPES, total, total))
        conn.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), %s)", (total,))
        conn.execute(
            "INSERT INTO finished_deliveries (id, event_id, destination_id, status, attempt,"
            "                                 next_attempt_at, created_at, completed_at, tenant_id)"
            " SELECT g, g, 1 + g %% %s,"
            "        CASE WHEN g %% 100 = 0 THEN 'dead' ELSE 'delivered' END::delivery_status,"
            "        1, t, t, t + interval '50 ms', 1"
            " FROM generate_series(1, %s) g,"
            f"      LATERAL (SELECT now() - %s * interval '{STEP}' + g * interval '{STEP}' AS t)"
            " ts", (DESTINATIONS, FINISHED, total))
        conn.execute(
            "INSERT INTO delivery_attempts (delivery_id, destination_id, attempt, started_at,"
            "                               duration_ms, status_code, response_body, error)"
            " SELECT g, 1 + g %% %s, 1,"
            "        now() - %s * interval '{STEP}' + g * interval '{STEP}',"
            "        5 + g %% 200, CASE WHEN g %% 100 = 0 THEN 500 ELSE 200 END, 'ok',"
            "        CASE WHEN g %% 100 = 0 THEN 'HTTP 500' END"
            " FROM generate_series(1, %s) g".replace("{STEP}", STEP),
            (DESTINATIONS, total, FINISHED))
        conn.execute("SELECT setval('delivery_id_seq', %s)", (FINISHED,))
        conn.execute(
            "INSERT INTO deliveries (event_id, destination_id, attempt, next_attempt_at,"
            "                        created_at, tenant_id)"
            " SELECT %s + g, 1 + g %% %s, CASE WHEN g %% 4 = 0 THEN 1 ELSE 0 END,"
            "        now() + interval '1 minute', now(), 1"
            " FROM generate_series(1, %s) g", (FINISHED, DESTINATIONS, PENDING))
        conn.execute(
            "INSERT INTO delivery_attempts (delivery_id, destination_id, attempt, started_at,"
            "                               duration_ms, status_code, error)"
            " SELECT id, destination_id, 1, now() - interval '30 s', 10000, NULL, 'timed out'"
            " FROM deliveries WHERE attempt = 1")
        conn.execute(ROLLUP_BACKFILL)
    conn.execute("VACUUM (ANALYZE) events, finished_deliveries, deliveries, delivery_attempts,"
                 " delivery_minutes")


@pytest.fixture(scope="module")
def big_dsn(database_factory: DatabaseFactory) -> Iterator[str]:
    yield from filled_database(database_factory, fill)


tx = pytest.fixture(rolled_back, name="tx")


def scanned_indexes(plan: Plan) -> set[str]:
    return {n["Index Name"] for n in nodes(plan) if "Index Name" in n}


def at(tx: psycopg.Connection, minutes_ago: float) -> dt.datetime:
    row = tx.execute("SELECT now() - %s * interval '1 minute'", (minutes_ago,)).fetchone()
    assert row is not None
    return row[0]


def check(explained: Plan, uses: set[str], record_property: Any, what: str, mode: str) -> None:
    plan = explained["Plan"]
    touched = seq_scanned(plan)
    assert not touched & HISTORY_TABLES, (what, touched)
    # "a|b": either index will do (type_walk).
    scanned = scanned_indexes(plan)
    missing = {u for u in uses if not set(u.split("|")) & scanned}
    assert not missing, (what, missing, scanned)
    ms = float(explained["Execution Time"])
    record_property(f"{what}_{mode}_execution_ms", ms)
    print(f"\n{what} ({mode}): execution {ms:.3f} ms, rows {plan['Actual Rows']}")


def type_walk(mode: str) -> str:
    """The index a walk of one event type's events must use. A custom plan knows the type
    and may walk all events by time and filter, for a common one reads as few rows; a
    generic plan does not know it and must walk the type's own index (console_events.sql
    and console_deliveries_by_event.sql are written so that it can)."""
    if mode == "force_generic_plan":
        return "events_tenant_type_created_idx"
    return "events_tenant_type_created_idx|events_tenant_created_idx"


def middle_cursor(tx: psycopg.Connection, table: str) -> int:
    """An id from the middle of the history: a page deep in the list."""
    row = tx.execute(f"SELECT id FROM {table} WHERE id = %s", (FINISHED // 2,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_events_pages_walk_their_index(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    cursor = middle_cursor(tx, "events")
    since, until = at(tx, 600), at(tx, 300)
    cases = [
        ("events_first_page", [None, None, None, 100, None, 1], {"events_tenant_created_idx"}),
        ("events_deep_page", [None, None, cursor, 100, None, 1],
         {"events_tenant_created_idx", "events_pkey"}),
        ("events_time_range", [since, until, None, 100, None, 1],
         {"events_tenant_created_idx"}),
        ("events_of_a_type", [None, None, cursor, 100, "type.7", 1], {type_walk(mode)}),
    ]
    for what, params, uses in cases:
        explained = explain(tx, mode, queries.CONSOLE_EVENTS,
                            "timestamptz, timestamptz, bigint, int, text, bigint", params)
        assert explained["Plan"]["Actual Rows"] == 100, what
        check(explained, uses, record_property, what, mode)


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_deliveries_by_event_type_and_time_walk_the_events_indexes(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    cursor = middle_cursor(tx, "finished_deliveries")
    types = "text, timestamptz, timestamptz, text, bigint, bigint, int, bigint"
    cases = [
        ("deliveries_of_a_type", ["type.3", None, None, None, None, None, 100, 1],
         {type_walk(mode)}, 100),
        ("deliveries_of_a_type_deep_dead", ["type.0", None, None, "dead", 1, cursor, 50, 1],
         {type_walk(mode)}, 50),
        ("deliveries_in_a_time_range", [None, at(tx, 120), at(tx, 60), None, 3, None, 100, 1],
         {"events_tenant_created_idx"}, 100),
    ]
    for what, params, uses, rows in cases:
        explained = explain(tx, mode, queries.CONSOLE_DELIVERIES_BY_EVENT, types, params)
        assert explained["Plan"]["Actual Rows"] == rows, what
        check(explained, uses | {"finished_deliveries_event_idx"}, record_property, what,
              mode)


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_dead_deliveries_and_depth_read_only_dead_rows(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    cursor = middle_cursor(tx, "finished_deliveries")
    cases = [
        ("dead_of_a_destination", [1, cursor, 50, 1],
         "finished_deliveries_dead_id_idx|finished_deliveries_tenant_dead_idx"),
        ("dead_of_all", [None, None, 50, 1], "finished_deliveries_tenant_dead_idx"),
    ]
    for what, params, index in cases:
        explained = explain(tx, mode, queries.CONSOLE_DEAD_DELIVERIES,
                            "bigint, bigint, int, bigint", params)
        assert explained["Plan"]["Actual Rows"] == 50, what
        check(explained, {index}, record_property, what, mode)
    explained = explain_plain(tx, queries.STATUS_QUEUE)
    check(explained, {"finished_deliveries_dead_idx|finished_deliveries_tenant_dead_idx"},
          record_property, "status_queue", mode)


def relations(plan: Plan) -> set[str]:
    return {n["Relation Name"] for n in nodes(plan) if "Relation Name" in n}


def rows_read(plan: Plan, relation: str) -> int:
    """Rows the plan's scans of `relation` read (returned or filtered out), over all their
    loops."""
    return sum((int(n["Actual Rows"]) + int(n.get("Rows Removed by Filter", 0)))
               * int(n.get("Actual Loops", 1))
               for n in nodes(plan) if n.get("Relation Name") == relation)


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_window_statistics_read_the_rollup_not_the_attempts(
    tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    """The chart, the destinations' windows and a destination's stats read the window's
    rollup rows through its indexes, and no attempt at all."""
    by_minute = "delivery_minutes_pkey"
    # One destination's window: through its own index, or (a generic plan, which cannot
    # tell how selective the destination is) the window's range of the primary key, whose
    # rows lie in minute order on disk, filtered: with 10 destinations the planner rightly
    # finds that cheaper. Either way the rows read are the window's, never more.
    of_one = f"delivery_minutes_destination_idx|{by_minute}"
    cases = [
        # (what, statement, types, params, indexes, rows returned, rollup rows read at most)
        ("console_minutes", queries.CONSOLE_MINUTES, "", [], {by_minute}, 60,
         61 * DESTINATIONS),
        ("console_destination_window", queries.CONSOLE_DESTINATION_WINDOW, "float8", [3600.0],
         {by_minute}, DESTINATIONS, 61 * DESTINATIONS),
        ("destination_stats_1h", queries.DESTINATION_STATS, "bigint, float8, timestamptz",
         [3, 3600.0, None], {of_one, "finished_deliveries_dead_idx"}, 1, 61 * DESTINATIONS),
        ("destination_stats_24h", queries.DESTINATION_STATS, "bigint, float8, timestamptz",
         [3, 86400.0, None], {of_one, "finished_deliveries_dead_idx"}, 1,
         (24 * 60 + 1) * DESTINATIONS),
    ]
    for what, statement, types, params, uses, rows, most in cases:
        if not params:  # no parameters: PREPARE takes no type list
            explained = explain_plain(tx, statement)
        else:
            explained = explain(tx, mode, statement, types, params)
        assert explained["Plan"]["Actual Rows"] == rows, what
        check(explained, uses, record_property, what, mode)
        plan = explained["Plan"]
        assert "delivery_attempts" not in relations(plan), what
        assert "delivery_minutes" not in seq_scanned(plan), what
        assert 0 < rows_read(plan, "delivery_minutes") <= most, what


def explain_plain(tx: psycopg.Connection, statement: Statement) -> Plan:
    row = tx.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement.sql).fetchone()
    assert row is not None
    return as_parents(tx, dict(row[0][0]))


CONSOLE_REQUESTS = (
    "/v1/overview",
    "/v1/destinations",
    "/v1/destinations/3/stats?window=1h",
    "/v1/destinations/3/stats?window=24h",
    "/v1/deliveries?limit=50",
    "/v1/deliveries?limit=50&status=dead&destination_id=3",
    "/v1/deliveries?limit=50&status=dead",
    "/v1/deliveries?limit=50&event_type=type.3",
    "/v1/deliveries?limit=50&event_type=type.0&status=dead&destination_id=1",
    "/v1/deliveries?limit=50&since={hour_ago}&until={half_hour_ago}",
    "/v1/deliveries/500000",
    "/v1/events/500000",
    "/v1/events?limit=50&type=type.9",
)


def test_console_request_times(big_dsn: str, record_property: Any) -> None:
    """Each console request over HTTP, median of 5 after a warm-up. Printed and recorded;
    asserted only to succeed."""
    now = dt.datetime.now(dt.UTC)
    stamp = {"hour_ago": now - dt.timedelta(hours=1),
             "half_hour_ago": now - dt.timedelta(minutes=30)}
    with IngressProcess(big_dsn) as ingress:
        lines = ["request | median ms | max ms"]
        for template in CONSOLE_REQUESTS:
            path = template.format(**{k: v.isoformat().replace("+00:00", "Z")
                                      for k, v in stamp.items()})
            assert ingress.request("GET", path).status == 200, path
            times = []
            for _ in range(5):
                started = time.perf_counter()
                answer = ingress.request("GET", path)
                times.append((time.perf_counter() - started) * 1000)
                assert answer.status == 200, (path, answer)
            median = statistics.median(times)
            record_property(f"console_request_ms {template}", median)
            lines.append(f"{template} | {median:.1f} | {max(times):.1f}")
    print("\n" + "\n".join(lines))

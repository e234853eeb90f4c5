"""Plan test of the claim over a partitioned events table (schema/026, docs/decisions/0036):
with 40 daily partitions present, the claim reads its events' payloads from one partition
only (run-time pruning on (id, created_at)), as custom and as generic plan; the result
write stays on its keys."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from engine.db import queries, queue_async
from engine.db.queue import Result
from tests.kit.dbserver import DatabaseFactory
from tests.test_claim_plan import (
    PLAN_MODES,
    claim_in,
    explain,
    explain_claim,
    filled_database,
    nodes,
    report,
    rolled_back,
)
from tests.test_history_partitions import start_days_back

pytestmark = pytest.mark.pg_versions

DAYS = 40
EVENTS_PER_DAY = 500
PENDING_DAY = 5  # every pending delivery's event is of this day


def fill(conn: psycopg.Connection) -> None:
    start_days_back(conn, DAYS)
    with conn.transaction():
        conn.execute("INSERT INTO destinations (url, secret)"
                     " VALUES ('http://127.0.0.1:9/', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')")
        conn.execute(
            "INSERT INTO events (type, payload, delivery_count, created_at)"
            " SELECT 'order.created', '{\"n\": ' || g || '}', 1,"
            "        date_trunc('day', now()) - d * interval '1 day' + g * interval '1 s'"
            " FROM generate_series(0, %s - 1) d, generate_series(1, %s) g",
            (DAYS, EVENTS_PER_DAY))
        conn.execute(
            "INSERT INTO deliveries (event_id, destination_id, tenant_id, created_at)"
            " SELECT e.id, 1, 1, e.created_at FROM events e"
            " WHERE e.created_at >= date_trunc('day', now()) - %s * interval '1 day'"
            "   AND e.created_at < date_trunc('day', now()) - %s * interval '1 day'",
            (PENDING_DAY, PENDING_DAY - 1))
    conn.execute("VACUUM (ANALYZE) events, deliveries")


@pytest.fixture(scope="module")
def days_dsn(database_factory: DatabaseFactory) -> Iterator[str]:
    yield from filled_database(database_factory, fill)



def events_partitions_read(explained: dict[str, Any]) -> set[str]:
    return {n["Partition"] for n in nodes(explained["Plan"])
            if n.get("Relation Name") == "events" and "Partition" in n
            and n.get("Actual Loops", 0) > 0}


@pytest.fixture
def days_tx(days_dsn: str) -> Iterator[psycopg.Connection]:
    yield from rolled_back(days_dsn)


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_the_claim_reads_one_events_partition(
    days_tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    present = days_tx.execute("SELECT count(*) FROM history_partitions()"
                              " WHERE parent = 'events'").fetchone()
    assert present is not None and present[0] >= DAYS
    explained = explain_claim(days_tx, mode)
    report(record_property, "claim_batch_40_days", mode, explained)
    assert explained["Plan"]["Actual Rows"] == 50
    read = events_partitions_read(explained)
    assert len(read) == 1, read


@pytest.mark.parametrize("mode", PLAN_MODES)
def test_the_result_write_over_40_days(
    days_tx: psycopg.Connection, mode: str, record_property: Any
) -> None:
    claims = claim_in(days_tx, "plan-w", 50)
    started = days_tx.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    results = [Result(c.id, c.attempt, "delivered" if i % 2 else "dead", started, 5, 200)
               for i, c in enumerate(claims)]
    params = queue_async.record_params("plan-w", results)
    explained = explain(days_tx, mode, queries.RECORD_RESULTS,
                        "text, json, int, int, int, int", list(params))
    report(record_property, "record_results_40_days", mode, explained)
    # The dead deliveries' events are read for their operational event: one partition.
    assert len(events_partitions_read(explained)) <= 1

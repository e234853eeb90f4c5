"""Partitioned history (schema/025, 026; docs/decisions/0036): the partition job creates
daily partitions ahead and drops them behind, never an events partition a delivery still
refers to, nor today's; a row outside every dated partition is still written; payload
retention clears payloads and response bodies and keeps the rest; DELETE
/v1/events/{id}/payload; the migration from the tables before it, with their rows."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.db.migrate import migrate
from engine.db.queue import EventIn, Result
from engine.maintenance.partitions import PartitionSettings, run_partitions
from engine.maintenance.payload_retention import (
    PayloadRetentionSettings,
    run_payload_retention,
)
from engine.observe.autovacuum_advice import Advice, apply
from engine.testing.ingress_server import IngressProcess
from tests import test_migrate
from tests.kit import queue_sync
from tests.kit.data import LEASE_MS, add_destination, now
from tests.kit.dbserver import DatabaseFactory, truncate_all
from tests.test_migrate import applied_rows, schema_up_to

pytestmark = pytest.mark.pg_versions
# test_migrate's fixture of a database with nothing in it (not cloned from the template).
empty_dsn = pytest.fixture(test_migrate.empty_dsn.__wrapped__, name="empty_dsn")

DAY = dt.timedelta(days=1)


def partitions(conn: psycopg.Connection, table: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT partition FROM history_partitions() WHERE parent = %s AND NOT is_default"
        " ORDER BY upper", [table]).fetchall()]


def start_days_back(conn: psycopg.Connection, days: int) -> None:
    """Replace the (empty) history's partitions with daily ones from `days` days ago to 3
    days ahead, as an engine running that long would have."""
    for (part,) in conn.execute("SELECT partition FROM history_partitions()"
                                " WHERE NOT is_default").fetchall():
        conn.execute("SELECT drop_history_partition(%s)", [part])
    conn.execute("SELECT ensure_history_partitions(now() + interval '3 days',"
                 " now() - make_interval(days => %s))", [days])


def enqueue(conn: psycopg.Connection, destinations: list[int], days_old: float,
            payload: str = '{"n": 1}') -> int:
    """One event (with deliveries to `destinations`) made `days_old` days ago: its and its
    deliveries' created_at moved back together, as the engine writes them."""
    with conn.transaction():
        event_id = queue_sync.enqueue_events(conn, [EventIn("t", payload, destinations)])[0][0]
        conn.execute("UPDATE events SET created_at = created_at - %s WHERE id = %s",
                     [days_old * DAY, event_id])
        conn.execute("UPDATE deliveries SET created_at = created_at - %s WHERE event_id = %s",
                     [days_old * DAY, event_id])
    assert event_id is not None
    return int(event_id)


def finish(conn: psycopg.Connection, event_id: int, days_ago: float,
           outcome: str = "delivered") -> int:
    """Claim and finish the event's delivery, `days_ago` days ago (completion and attempt)."""
    claims = [c for c in queue_sync.claim_batch(conn, "w", 100, LEASE_MS)
              if c.event_id == event_id]
    assert len(claims) == 1
    queue_sync.record_results(conn, "w", [
        Result(claims[0].id, 1, outcome, now(conn) - days_ago * DAY, 3, 200, None, "body")])
    # Any other claim of this batch goes back (only this event's is finished here).
    conn.execute("UPDATE deliveries SET status = 'pending', locked_by = NULL,"
                 " locked_until = NULL, claim_token = NULL, attempt = attempt - 1"
                 " WHERE status = 'in_flight'")
    conn.execute("UPDATE finished_deliveries SET completed_at = completed_at - %s"
                 " WHERE event_id = %s", [days_ago * DAY, event_id])
    return claims[0].id


def event_ids(conn: psycopg.Connection) -> set[int]:
    return {r[0] for r in conn.execute("SELECT id FROM events").fetchall()}


def orphans(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM deliveries d WHERE NOT EXISTS"
        "         (SELECT 1 FROM events e WHERE e.id = d.event_id))"
        "     + (SELECT count(*) FROM finished_deliveries f WHERE NOT EXISTS"
        "         (SELECT 1 FROM events e WHERE e.id = f.event_id))").fetchone()
    assert row is not None
    return int(row[0])


def test_creates_ahead_drops_behind_and_keeps_what_a_delivery_refers_to(
    conn: psycopg.Connection
) -> None:
    start_days_back(conn, 10)
    paused = add_destination(conn, paused=True)
    live = add_destination(conn)
    waiting = enqueue(conn, [paused], days_old=8)  # a delivery waits: kept
    done = enqueue(conn, [live], days_old=9)  # finished 9 days ago: dropped
    dead_recently = enqueue(conn, [live], days_old=7)  # its dead delivery is recent: kept
    today = enqueue(conn, [live], days_old=0)
    finish(conn, done, days_ago=9)
    finish(conn, dead_recently, days_ago=1, outcome="dead")
    events_before = partitions(conn, "events")

    report = run_partitions(conn, PartitionSettings(retention_days=5, days_ahead=4))

    assert report.complete and report.gave_up_waiting == 0
    assert report.created == 3  # one more day ahead for each table
    kept = partitions(conn, "events")
    day = {e: conn.execute("SELECT tableoid::regclass::text FROM events WHERE id = %s",
                           [e]).fetchone()[0]  # type: ignore[index]
           for e in (waiting, dead_recently, today)}
    assert day[waiting] in kept and day[dead_recently] in kept and day[today] in kept
    # Every other day wholly older than 5 days is gone, from all three tables.
    cutoff = now(conn) - 5 * DAY
    old_left = conn.execute(
        "SELECT parent, partition FROM history_partitions()"
        " WHERE NOT is_default AND upper <= %s", [cutoff]).fetchall()
    assert sorted(p for _, p in old_left) == sorted([day[waiting], day[dead_recently]])
    assert set(report.dropped_partitions) == (
        set(events_before) - set(kept)) | {
        p for p in report.dropped_partitions if not p.startswith("events_")}
    assert event_ids(conn) == {waiting, dead_recently, today}
    assert orphans(conn) == 0
    ahead = conn.execute("SELECT max(upper) FROM history_partitions()").fetchone()[0]  # type: ignore[index]
    assert ahead >= now(conn) + 4 * DAY

    # Once nothing waits for it, the day goes too; today's never does.
    conn.execute("DELETE FROM deliveries WHERE event_id = %s", [waiting])
    again = run_partitions(conn, PartitionSettings(retention_days=5, days_ahead=4))
    assert day[waiting] in again.dropped_partitions
    assert event_ids(conn) == {dead_recently, today}
    shortest = run_partitions(conn, PartitionSettings(retention_days=0.01, days_ahead=4))
    assert day[today] not in shortest.dropped_partitions
    assert today in event_ids(conn)


def test_tuned_history_keeps_its_autovacuum_settings_in_the_days_made_later(
    conn: psycopg.Connection
) -> None:
    """`engine tune-autovacuum` sets a partitioned table's settings on each partition
    (PostgreSQL keeps none on the parent), and the partition job gives each new day
    those of the newest one (schema/027)."""
    tuned = Advice("delivery_attempts", {"autovacuum_vacuum_threshold": 20_000,
                                         "autovacuum_vacuum_scale_factor": 0}, ("test", "test"))
    apply(conn, [tuned])
    settings_of = dict(conn.execute(
        "SELECT c.relname, c.reloptions FROM history_partitions() h"
        " JOIN pg_class c ON c.relname = h.partition WHERE h.parent = 'delivery_attempts'"
    ).fetchall())
    assert set(map(tuple, settings_of.values())) == {
        ("autovacuum_vacuum_threshold=20000", "autovacuum_vacuum_scale_factor=0")}
    newest = partitions(conn, "delivery_attempts")[-1]
    report = run_partitions(conn, PartitionSettings(retention_days=30, days_ahead=6))
    assert report.created > 0
    made = [p for p in partitions(conn, "delivery_attempts") if p > newest]
    assert made
    for part in made:
        assert conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s",
                            [part]).fetchone() == (
            ["autovacuum_vacuum_threshold=20000", "autovacuum_vacuum_scale_factor=0"],)
    # An untuned table's new days have none.
    assert all(conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s",
                            [part]).fetchone() == (None,)
               for part in partitions(conn, "events"))


def test_a_row_beyond_every_partition_is_written_then_moved_into_its_day(
    conn: psycopg.Connection
) -> None:
    dest = add_destination(conn)
    event_id = enqueue(conn, [dest], days_old=-30)  # a clock 30 days ahead
    assert conn.execute("SELECT tableoid::regclass::text FROM events WHERE id = %s",
                        [event_id]).fetchone() == ("events_default",)
    # The claim finds it there, as anywhere.
    assert [c.event_id for c in queue_sync.claim_batch(conn, "w", 10, LEASE_MS)] == [event_id]
    run_partitions(conn, PartitionSettings(retention_days=30, days_ahead=32))
    where = conn.execute("SELECT tableoid::regclass::text, payload FROM events WHERE id = %s",
                         [event_id]).fetchone()
    assert where is not None and where[0].startswith("events_p") and where[1] == '{"n": 1}'
    assert conn.execute("SELECT count(*) FROM events_default").fetchone() == (0,)


def test_payload_retention_clears_payloads_and_bodies_and_keeps_the_rest(
    conn: psycopg.Connection
) -> None:
    start_days_back(conn, 10)
    paused = add_destination(conn, paused=True)
    live = add_destination(conn)
    old = [enqueue(conn, [live], days_old=8, payload=f'{{"n": {i}}}') for i in range(5)]
    waiting = enqueue(conn, [paused], days_old=8)
    recent = enqueue(conn, [live], days_old=1)
    for event_id in old:
        finish(conn, event_id, days_ago=8)
    settings_ = PayloadRetentionSettings(payload_retention_days=5, batch=2)

    report = run_payload_retention(conn, settings_)

    assert report.complete and report.payloads == 5 and report.kept == 1
    assert report.response_bodies == 5
    rows = dict(conn.execute("SELECT id, payload FROM events").fetchall())
    assert all(rows[e] is None for e in old)
    assert rows[waiting] == '{"n": 1}' and rows[recent] == '{"n": 1}'
    # The metadata stays: the event, its finished delivery and attempt, without the body.
    assert conn.execute("SELECT count(*), count(response_body) FROM delivery_attempts"
                        ).fetchone() == (5, 0)
    assert conn.execute("SELECT count(*) FROM finished_deliveries").fetchone() == (5,)
    # The waiting event's day is swept again next run; the others are done.
    again = run_payload_retention(conn, settings_)
    assert again.payloads == 0 and again.kept == 1
    conn.execute("DELETE FROM deliveries WHERE event_id = %s", [waiting])
    assert run_payload_retention(conn, settings_).payloads == 1
    assert run_payload_retention(conn, settings_).batches == 0


@pytest.fixture(scope="module")
def history_db(database_factory: DatabaseFactory) -> psycopg.Connection:
    url = database_factory.create()
    with psycopg.connect(url, autocommit=True) as conn:
        yield conn
    database_factory.drop(url)


AGES = st.lists(st.tuples(
    st.floats(min_value=0, max_value=11.5),  # the event's age in days
    st.sampled_from(["pending", "finished", "none"]),
    st.floats(min_value=0, max_value=1),  # when it finished, as a share of its age
), min_size=1, max_size=12)


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ages=AGES, retention_days=st.sampled_from([1, 3, 5]))
def test_no_event_a_delivery_refers_to_is_ever_dropped(
    history_db: psycopg.Connection, ages: list[tuple[float, str, float]], retention_days: int
) -> None:
    conn = history_db
    truncate_all(conn)
    start_days_back(conn, 12)
    paused = add_destination(conn, paused=True)
    live = add_destination(conn)
    made = []
    for age, state, share in ages:
        if state == "none":
            made.append(enqueue(conn, [], days_old=age))
        elif state == "pending":
            made.append(enqueue(conn, [paused], days_old=age))
        else:
            event_id = enqueue(conn, [live], days_old=age)
            finish(conn, event_id, days_ago=age * share)
            made.append(event_id)
    run_partitions(conn, PartitionSettings(retention_days=retention_days))
    assert orphans(conn) == 0
    # What went was old: an event younger than the retention is never dropped.
    cutoff_age = retention_days
    young = {e for e, (age, _, _) in zip(made, ages, strict=True) if age < cutoff_age}
    assert young <= event_ids(conn)


def test_delete_payload_route(api: IngressProcess, db: psycopg.Connection) -> None:
    dest = api.request("POST", "/v1/destinations", {"url": "http://127.0.0.1:9/"}).json()
    alone = api.request("POST", "/v1/events", {"type": "t", "payload": {"a": 1},
                                               "destination_ids": []}).json()["id"]
    queued = api.request("POST", "/v1/events", {"type": "t", "payload": {"b": 2},
                                                "destination_ids": [dest["id"]]}).json()["id"]
    tenant = api.request("POST", "/v1/tenants", {"uid": "other"}).json()
    key = api.request("POST", f"/v1/tenants/{tenant['id']}/keys", {"name": "k"}).json()["key"]
    other = {"authorization": f"Bearer {key}"}

    # Another tenant's event is unknown to it, and stays as it was.
    answer = api.request("DELETE", f"/v1/events/{alone}/payload", headers=other)
    assert answer.status == 404
    assert db.execute("SELECT payload FROM events WHERE id = %s", [alone]).fetchone() == (
        '{"a": 1}',)
    # A delivery still to be sent keeps its payload: 409.
    answer = api.request("DELETE", f"/v1/events/{queued}/payload")
    assert answer.status == 409 and answer.json()["error"]["code"] == "conflict"
    answer = api.request("DELETE", f"/v1/events/{alone}/payload")
    assert answer.status == 204
    read = api.request("GET", f"/v1/events/{alone}").json()
    assert read["payload"] is None and read["type"] == "t"
    assert api.request("DELETE", f"/v1/events/{alone}/payload").status == 204
    assert api.request("DELETE", "/v1/events/999999/payload").status == 404


def test_migration_from_the_tables_before_it_keeps_their_rows(
    empty_dsn: str, tmp_path: Path
) -> None:
    migrate(empty_dsn, schema_up_to(tmp_path, 24))
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        dest = add_destination(conn)
        conn.execute(
            "WITH e AS (INSERT INTO events (type, payload, delivery_count, idempotency_key,"
            "                               request_hash)"
            "           SELECT 't', '{\"old\": ' || g || '}', 1,"
            "                  CASE WHEN g = 1 THEN 'key-1' END, '\\x01'"
            "             FROM generate_series(1, 3) g RETURNING id, created_at)"
            " INSERT INTO deliveries (event_id, destination_id, tenant_id, created_at)"
            " SELECT id, %s, 1, created_at FROM e", [dest])
        claims = queue_sync.claim_batch(conn, "w", 1, LEASE_MS)
        queue_sync.record_results(conn, "w", [
            Result(claims[0].id, 1, "delivered", now(conn), 3, 200, None, "ok")])
        before = conn.execute("SELECT max(id) FROM events").fetchone()[0]  # type: ignore[index]

    migrate(empty_dsn)

    assert "026_history_partitions" in [name for _, name in applied_rows(empty_dsn)]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*), count(DISTINCT tableoid) FROM events"
                            ).fetchone() == (3, 1)
        assert conn.execute("SELECT count(*) FROM finished_deliveries").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM delivery_attempts").fetchone() == (1,)
        # New rows after the cutover: ids go on from the old ones, the claim finds both.
        with conn.transaction():
            answers = queue_sync.enqueue_events(conn, [
                EventIn("t", '{"new": 1}', [dest]),
                EventIn("t", '{"again": 1}', [dest], idempotency_key="key-1"),
            ])
        assert answers[0][0] is not None and answers[0][0] > before
        assert answers[1][0] is None  # the key of an event from before: refused
        assert conn.execute("SELECT event_id FROM idempotency_keys WHERE idempotency_key ="
                            " 'key-1'").fetchone() == (1,)
        claimed = queue_sync.claim_batch(conn, "w", 10, LEASE_MS)
        assert len(claimed) == 3 and all(c.payload for c in claimed)
        ids = conn.execute("SELECT count(*), count(DISTINCT id) FROM events").fetchone()
        assert ids == (4, 4)


"""`engine status`: its numbers equal what SQL says, and its warnings fire."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import psycopg

from engine.db import queue
from engine.db.queue import EventIn, Result
from engine.observe.status import EXPIRED_IN_FLIGHT_WARN, collect_status, to_json, to_text
from tests.kit import queue_sync
from tests.kit.data import LEASE_MS, add_destination, now
from tests.kit.dbserver import leaves

ENGINE = [sys.executable, "-m", "engine.cli"]


def one(conn: psycopg.Connection, query: str, *params: object) -> object:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def build_state(conn: psycopg.Connection) -> tuple[int, int, int]:
    busy = add_destination(conn, url="http://127.0.0.1:9/busy")
    down = add_destination(conn, url="http://127.0.0.1:9/down")
    quiet = add_destination(conn, url="http://127.0.0.1:9/quiet")
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [busy]) for _ in range(30)])
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [down, quiet]) for _ in range(5)])
    claims = queue_sync.claim_batch(conn, "w", 12, LEASE_MS)
    t = now(conn)
    queue_sync.record_results(conn, "w", [
        Result(c.id, c.attempt, "dead" if i < 3 else "retry", t, 1, 500, "e", None,
               t + dt.timedelta(hours=1))
        for i, c in enumerate(claims[:6])
    ], queue.BreakerSettings(threshold=100))
    queue_sync.claim_batch(conn, "w", 4, LEASE_MS)
    conn.execute("UPDATE deliveries SET locked_until = now() - interval '1 minute'"
                 " WHERE id IN (SELECT id FROM deliveries WHERE status = 'in_flight' LIMIT 2)")
    conn.execute("UPDATE destinations SET breaker = 'open', paused_until = now() + interval"
                 " '10 minutes', breaker_opened_at = now() - interval '3 hours',"
                 " consecutive_failures = 40 WHERE id = %s", [down])
    conn.execute("ANALYZE")
    # This session's table counters reach the statistics at the end of a transaction at
    # most once a second: flush them now, so that status and the checks below read the
    # same numbers whatever the timing.
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    return busy, down, quiet


def test_numbers_equal_sql(conn: psycopg.Connection) -> None:
    busy, down, _ = build_state(conn)
    status = collect_status(conn, top=2)
    q = status["queue"]
    assert q["pending"] == one(conn, "SELECT count(*) FROM deliveries WHERE status = 'pending'")
    assert q["in_flight"] == one(
        conn, "SELECT count(*) FROM deliveries WHERE status = 'in_flight'") == 10
    assert q["expired_in_flight"] == 2
    assert q["retrying"] == 3
    assert q["dead"] == one(
        conn, "SELECT count(*) FROM finished_deliveries WHERE status = 'dead'") == 3
    assert q["pending"] + q["in_flight"] + q["dead"] == 40
    oldest = one(conn, "SELECT extract(epoch FROM now() - min(created_at))::float8"
                       " FROM deliveries WHERE status = 'pending'")
    assert abs(q["oldest_pending_age_s"] - oldest) < 5
    assert status["breakers"] == {"closed": 2, "open": 1, "half_open": 0,
                                       "disabled": 0, "paused": 0, "open_for_hours": 1}
    tops = status["destinations"]
    assert [d["id"] for d in tops] == [busy, down]  # top 2 by backlog
    for d in tops:
        assert d["pending"] == one(conn, "SELECT count(*) FROM deliveries WHERE"
                                         " destination_id = %s AND status = 'pending'", d["id"])
        assert d["in_flight"] == one(conn, "SELECT count(*) FROM deliveries WHERE"
                                           " destination_id = %s AND status = 'in_flight'",
                                     d["id"])
    assert tops[1]["breaker"] == "open" and tops[1]["consecutive_failures"] == 40
    tables = {t["name"]: t for t in status["tables"]}
    assert set(tables) == {"destinations", "events", "deliveries", "finished_deliveries",
                           "delivery_attempts"}
    # A partitioned table (the history, schema/026) is the sum over its partitions.
    for name, t in tables.items():
        parts = leaves(conn, name)
        assert t["total_bytes"] == one(
            conn, "SELECT sum(pg_total_relation_size(p::regclass))::bigint"
                  " FROM unnest(%s::text[]) p", parts)
        assert t["n_dead_tup"] == one(conn, "SELECT sum(n_dead_tup)::bigint"
                                            " FROM pg_stat_user_tables"
                                            " WHERE relname = ANY(%s)", parts)
    assert len(leaves(conn, "events")) > 1 and leaves(conn, "deliveries") == ["deliveries"]
    # deliveries: absolute trigger from its reloptions (001_core.sql): 5000.
    assert tables["deliveries"]["vacuum_trigger"] == 5000
    assert {i["name"] for i in status["indexes"]} >= {"deliveries_claimable_idx"}
    assert any("destination" in w and "for 3.0 h" in w for w in status["warnings"])


def test_warnings_reaper_and_autovacuum(conn: psycopg.Connection) -> None:
    dest = add_destination(conn)
    count = EXPIRED_IN_FLIGHT_WARN
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [dest]) for _ in range(count)])
    queue_sync.claim_batch(conn, "lost", count, 1)
    conn.execute("UPDATE deliveries SET locked_until = now() - interval '1 minute'")
    status = collect_status(conn)
    assert any(w.startswith("lease reaper busy") for w in status["warnings"])
    # The events table has the default trigger (50 + 20 % of its rows); autovacuum is off
    # for it here so that it cannot catch up while the test looks.
    for leaf in leaves(conn, "events"):
        conn.execute(f"ALTER TABLE {leaf} SET (autovacuum_enabled = false)")
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", []) for _ in range(300)])
    conn.execute("DELETE FROM events WHERE delivery_count = 0")
    conn.execute("SELECT pg_stat_force_next_flush()")
    status = collect_status(conn)
    events = next(t for t in status["tables"] if t["name"] == "events")
    assert events["n_dead_tup"] >= 300
    assert any(w.startswith("autovacuum behind on events") for w in status["warnings"])


def test_cli_json_and_text(dsn: str, conn: psycopg.Connection) -> None:
    build_state(conn)
    out = subprocess.run([*ENGINE, "status", "--json", "--dsn", dsn], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    status = json.loads(out)
    assert status["queue"]["in_flight"] == 10 and len(status["destinations"]) == 3
    text = subprocess.run([*ENGINE, "status", "--dsn", dsn], capture_output=True, text=True,
                          timeout=60, check=True).stdout
    assert "10 in flight (2 expired)" in text and "WARNING: destination" in text


def add_tenants_with_backlogs(conn: psycopg.Connection, sizes: dict[str, int]) -> dict[str, int]:
    """One tenant per uid with a destination of its own and `sizes[uid]` pending
    deliveries to it; returns each uid's tenant id."""
    ids: dict[str, int] = {}
    events = []
    for uid, size in sizes.items():
        row = conn.execute("INSERT INTO tenants (uid) VALUES (%s) RETURNING id", [uid]).fetchone()
        assert row is not None
        ids[uid] = int(row[0])
        destination = add_destination(conn, url=f"http://127.0.0.1:9/{uid}", tenant_id=ids[uid])
        events += [EventIn("t", "{}", [destination], tenant_id=ids[uid]) for _ in range(size)]
    with conn.transaction():
        queue_sync.enqueue_events(conn, events)
    return ids


def test_tenants_with_the_largest_backlogs(conn: psycopg.Connection) -> None:
    # Twelve tenants, t01 with 1 delivery ... t12 with 12; `default` has none.
    ids = add_tenants_with_backlogs(conn, {f"t{i:02d}": i for i in range(1, 13)})
    claimed = queue_sync.claim_batch(conn, "w", 20, LEASE_MS)
    conn.execute("UPDATE deliveries SET next_attempt_at = now() - interval '5 minutes'"
                 " WHERE tenant_id = %s AND status = 'pending'", [ids["t10"]])
    status = collect_status(conn)
    tenants = status["tenants"]
    by_sql = {uid: (int(p), int(f)) for uid, p, f in conn.execute(
        "SELECT t.uid, count(*) FILTER (WHERE d.status = 'pending'),"
        " count(*) FILTER (WHERE d.status = 'in_flight')"
        " FROM deliveries d JOIN tenants t ON t.id = d.tenant_id GROUP BY t.uid").fetchall()}
    assert sum(f for _, f in by_sql.values()) == len(claimed) == 20
    # The ten largest backlogs, largest first: t12 ... t03; t02, t01 and default left out.
    assert [t["uid"] for t in tenants] == [f"t{i:02d}" for i in range(12, 2, -1)]
    for t in tenants:
        assert (t["pending"], t["in_flight"]) == by_sql[t["uid"]]
        assert t["id"] == ids[t["uid"]]
    # Its oldest due delivery waited 5 minutes past its due time; t11's are due about now.
    assert by_sql["t10"][0] > 0
    assert 290 <= tenants[2]["oldest_due_age_s"] < 400
    assert tenants[1]["uid"] == "t11" and tenants[1]["oldest_due_age_s"] < 60
    text = to_text(status)
    assert "t12" in text and "t02 " not in text
    assert json.loads(to_json(status))["tenants"][0]["uid"] == "t12"

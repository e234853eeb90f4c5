"""The tenant scenarios (noisy-neighbour, tenants-10k): their numbers from known inputs,
the tenants and destinations they write in bulk against the API's own, and each --quick
run end to end on a real PostgreSQL, its report holding the fields bench/README.md names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.harness import noisy_neighbour, tenants_scale
from bench.harness.noisy_neighbour import Accepted, Windows, b_latencies
from bench.harness.tenants import (
    Api,
    create_destinations,
    create_tenants,
    median,
    percentiles,
    ratio,
    tenant_through_api,
)
from engine.testing.ingress_server import IngressProcess
from tests.kit.dbserver import DatabaseFactory

ROOT = Path(__file__).resolve().parents[1]
QUICK_TIMEOUT_S = 240


def test_percentiles_are_nearest_rank_with_the_maximum() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 1..100, in any order
    assert percentiles(values) == {"p50": 50.0, "p95": 95.0, "p99": 99.0, "max": 100.0}
    assert percentiles([7.0]) == {"p50": 7.0, "p95": 7.0, "p99": 7.0, "max": 7.0}
    # Ten values: p99 is the largest, p50 the fifth.
    assert percentiles([float(v) for v in range(10)]) == {
        "p50": 4.0, "p95": 9.0, "p99": 9.0, "max": 9.0}
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None, "max": None}


def test_ratios_and_medians_skip_what_was_not_measured() -> None:
    assert ratio(9_000, 10_000) == 0.9
    assert ratio(2, 3) == 0.667
    assert ratio(1, 0) is None and ratio(None, 3) is None
    assert median([3, None, 1, 2]) == 2
    assert median([None]) is None


def test_b_latency_counts_each_event_in_its_window() -> None:
    """B alone (before A's backlog is written at 50 ms), while it is written (to 100 ms,
    when it falls due), while it drains (to 200 ms), after it (left out), and accepted
    but never delivered."""
    accepted = [Accepted(1, 0.0, 10.0), Accepted(6, 55.0, 60.0), Accepted(2, 95.0, 100.0),
                Accepted(3, 150.0, 160.0), Accepted(4, 300.0, 310.0),
                Accepted(5, 180.0, 190.0)]
    arrivals = {"evt_1": 30, "evt_6": 75, "evt_2": 400, "evt_3": 260, "evt_4": 320}
    started = {"evt_2": 380.0, "evt_3": 250.0, "evt_4": 315.0}  # evt_5 never arrived
    found = b_latencies(accepted, arrivals, Windows(fill_ms=50, due_ms=100, drained_ms=200),
                        started)
    assert found["accepted"] == 6
    assert found["never_delivered"] == 1
    assert found["latency_ms_b_alone"] == {
        "events": 1, "p50": 20.0, "p95": 20.0, "p99": 20.0, "max": 20.0}
    assert found["latency_ms_while_a_backlog_written"] == {
        "events": 1, "p50": 15.0, "p95": 15.0, "p99": 15.0, "max": 15.0}
    assert found["latency_ms_while_a_drains"] == {
        "events": 2, "p50": 100.0, "p95": 300.0, "p99": 300.0, "max": 300.0}
    assert found["accept_ms"]["max"] == 10.0
    # Split at the worker's request: in the engine, then on the way to the receiver.
    assert found["while_a_drains_accepted_to_request_ms"] == {
        "p50": 90.0, "p95": 280.0, "p99": 280.0, "max": 280.0}
    assert found["while_a_drains_request_to_arrival_ms"] == {
        "p50": 10.0, "p95": 20.0, "p99": 20.0, "max": 20.0}


def test_noisy_neighbour_pairs_and_pass_lines() -> None:
    def latency(p99: float) -> dict[str, Any]:
        return {"b": {"latency_ms_while_a_drains": {
            "events": 40, "p50": 20.0, "p95": 80.0, "p99": p99, "max": p99 + 5}}}

    alone = {"a_deliveries_per_s": 8_000.0, "b": None}
    fast = noisy_neighbour.pair(alone, {"a_deliveries_per_s": 7_600.0, **latency(240.0)})
    assert fast["a_ratio"] == 0.95 and fast["b_p99_ms"] == 240.0
    slow = noisy_neighbour.pair(alone, {"a_deliveries_per_s": 6_400.0, **latency(30_000.0)})
    assert slow["a_ratio"] == 0.8
    passed = noisy_neighbour.verdict([fast])
    assert passed["b_p99_pass"] and passed["a_ratio_pass"]
    assert [line.rsplit(" ", 1)[1] for line in passed["lines"]] == ["PASS", "PASS"]
    # Three repeats: the medians decide.
    judged = noisy_neighbour.verdict([slow, fast, slow])
    assert judged["median"]["b_p99_ms"] == 30_000.0 and judged["median"]["a_ratio"] == 0.8
    assert not judged["b_p99_pass"] and not judged["a_ratio_pass"]
    assert [line.rsplit(" ", 1)[1] for line in judged["lines"]] == ["FAIL", "FAIL"]


def test_tenants_10k_pairs_and_pass_lines() -> None:
    def phase(rate: float, pg_us: float, engine_us: float) -> dict[str, Any]:
        return {"deliveries_per_s": rate,
                "cpu_us_per_delivery": {"postgres": pg_us, "engine": engine_us}}

    one = phase(10_000, 50.0, 80.0)
    close = tenants_scale.pair(one, phase(9_500, 54.0, 80.0))
    assert close == {"one_tenant_per_s": 10_000, "spread_per_s": 9_500, "rate_ratio": 0.95,
                     "one_tenant_pg_cpu_us": 50.0, "spread_pg_cpu_us": 54.0,
                     "pg_cpu_ratio": 1.08, "engine_cpu_ratio": 1.0}
    assert tenants_scale.verdict([close])["lines"][0].endswith("PASS")
    costly = tenants_scale.pair(one, phase(8_000, 60.0, 90.0))
    judged = tenants_scale.verdict([costly])
    assert not judged["rate_pass"] and not judged["pg_cpu_pass"]
    assert all(line.endswith("FAIL") for line in judged["lines"])


def comparable(conn: psycopg.Connection, table: str, row_id: int) -> dict[str, Any]:
    """A row as JSON without what differs between any two rows (ids, names, times)."""
    row = conn.execute(sql.SQL(
        "SELECT to_jsonb(t) - ARRAY['id', 'uid', 'name', 'url', 'secret', 'tenant_id',"
        " 'created_at', 'updated_at'] FROM {} t WHERE id = %s").format(sql.Identifier(table)),
        (row_id,)).fetchone()
    assert row is not None
    result: dict[str, Any] = row[0]
    return result


def test_bulk_rows_are_the_ones_the_api_writes(api: IngressProcess, db: psycopg.Connection
                                               ) -> None:
    made = tenant_through_api(Api(api.base_url), "through-api", "http://127.0.0.1:9/a")
    assert made.key.startswith("ek_")
    [bulk_tenant] = create_tenants(db, ["in-bulk"])
    [bulk_destination] = create_destinations(db, [(bulk_tenant, "http://127.0.0.1:9/b")])
    assert comparable(db, "tenants", bulk_tenant) == comparable(db, "tenants", made.id)
    assert comparable(db, "destinations", bulk_destination) == comparable(
        db, "destinations", made.destination_id)
    rows = db.execute(
        "SELECT d.tenant_id, length(d.secret), d.secret LIKE 'whsec_%%', t.name"
        "  FROM destinations d JOIN tenants t ON t.id = d.tenant_id"
        " WHERE d.id = ANY(%s) ORDER BY d.id",
        ([made.destination_id, bulk_destination],)).fetchall()
    assert rows == [(made.id, rows[1][1], True, "bench through-api"),
                    (bulk_tenant, rows[1][1], True, "bench in-bulk")]


def quick_run(scenario: str, database: str, admin_dsn: str, reports: Path
              ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    try:
        run = subprocess.run(
            [sys.executable, "-m", "bench", scenario, "--quick", "--procs", "1",
             "--dsn", admin_dsn, "--reports", str(reports)],
            cwd=ROOT, capture_output=True, text=True, timeout=QUICK_TIMEOUT_S,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(database)))
    assert run.returncode == 0, run.stderr[-3000:]
    [path] = reports.glob(f"{scenario}-*.json")
    report: dict[str, Any] = json.loads(path.read_text())
    assert report["lines"] == run.stdout.strip().splitlines()[-3:-1]
    return run, report


def test_noisy_neighbour_quick_end_to_end(database_factory: DatabaseFactory,
                                          tmp_path: Path) -> None:
    _, report = quick_run("noisy-neighbour", noisy_neighbour.BENCH_DB,
                          database_factory.admin_dsn, tmp_path)
    backlog = noisy_neighbour.QUICK_BACKLOG
    assert report["options"]["backlog"] == backlog
    phases = {phase["phase"]: phase for phase in report["phases"]}
    assert set(phases) == {"A alone", "A with B"}
    for phase in phases.values():
        assert phase["a_delivered"] == phase["a_recorded_delivered"] == backlog
        assert phase["a_duplicates"] == 0 and phase["left_in_queue"] == 0
        assert phase["a_deliveries_per_s"] > 0
        assert set(phase["cpu_us_per_a_delivery"]) == {"engine", "postgres"}
    assert phases["A alone"]["b"] is None
    b = phases["A with B"]["b"]
    assert b["accepted"] == b["sent"] > 0 and b["refused"] == {}
    assert b["never_delivered"] == 0 and b["duplicates"] == 0
    for window in ("latency_ms_while_a_drains", "latency_ms_b_alone"):
        assert b[window]["events"] > 0
        assert b[window]["p50"] <= b[window]["p95"] <= b[window]["p99"] <= b[window]["max"]
    [pair] = report["pairs"]
    assert set(pair) == {"a_alone_per_s", "a_with_b_per_s", "a_ratio",
                         "b_events_while_a_drains", "b_p50_ms", "b_p95_ms", "b_p99_ms",
                         "b_max_ms"}
    assert report["median"] == pair
    assert report["lines"][0].startswith("B accept-to-delivered p99 while A drains: ")
    assert report["lines"][1].startswith("A's drain with B / alone: ")


def test_tenants_10k_quick_end_to_end(database_factory: DatabaseFactory,
                                      tmp_path: Path) -> None:
    _, report = quick_run("tenants-10k", tenants_scale.BENCH_DB, database_factory.admin_dsn,
                          tmp_path)
    tenants, deliveries = tenants_scale.QUICK_TENANTS, tenants_scale.QUICK_DELIVERIES
    phases = {phase["phase"]: phase for phase in report["phases"]}
    assert set(phases) == {"spread", "one tenant"}
    assert phases["spread"]["tenants"] == phases["spread"]["tenants_delivered_to"] == tenants
    assert phases["one tenant"]["tenants"] == phases["one tenant"]["tenants_delivered_to"] == 1
    for phase in phases.values():
        assert phase["destinations"] == tenants * tenants_scale.PER_TENANT
        assert phase["delivered_at_destination"] == phase["recorded_delivered"] == deliveries
        assert phase["duplicates"] == 0 and phase["left_in_queue"] == 0
        assert phase["deliveries_per_s"] > 0
        assert set(phase["cpu_us_per_delivery"]) == {"engine", "postgres", "destination"}
    [pair] = report["pairs"]
    assert set(pair) == {"one_tenant_per_s", "spread_per_s", "rate_ratio",
                         "one_tenant_pg_cpu_us", "spread_pg_cpu_us", "pg_cpu_ratio",
                         "engine_cpu_ratio"}
    assert pair["rate_ratio"] > 0 and pair["pg_cpu_ratio"] > 0
    assert report["lines"][0].startswith("drain spread / one tenant: ")
    assert report["lines"][1].startswith("PostgreSQL CPU per delivery spread / one tenant: ")

"""The bench at a tiny size: the registry of scenarios, tool checks, one contention cell on
a real database, the report folder and the metrics parsing the scenarios rely on."""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bench.harness import (
    bloat,
    bloat_history,
    cli,
    contention,
    ingest_ceiling,
    partition_migration,
    stack,
)
from bench.harness.report import Report, figure
from engine.db.migrate import migrate
from tests import test_migrate

ROOT = Path(__file__).resolve().parents[1]


def harness(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def documented_scenarios() -> set[str]:
    """Every scenario the READMEs tell a user to run: bench/README.md's table, and each
    `bench/run.sh NAME` or `python -m bench NAME` in either README."""
    bench_readme = (ROOT / "bench" / "README.md").read_text()
    names = set(re.findall(r"^\| `([a-z0-9-]+)` \|", bench_readme, re.MULTILINE))
    for text in (bench_readme, (ROOT / "README.md").read_text()):
        names |= set(re.findall(r"(?:bench/run\.sh|python -m bench) ([a-z][a-z0-9-]+)", text))
    return names


def test_the_registry_runs_every_documented_scenario() -> None:
    documented = documented_scenarios()
    assert {"throughput", "slow-destination", "dead-destination", "contention", "bloat",
            "all", "drain-fast", "drain-slow", "peers", "ingress"} <= documented
    assert documented <= set(cli.SCENARIOS), documented - set(cli.SCENARIOS)
    listed = harness("--help")
    assert listed.returncode == 0, listed.stderr
    for name, scenario in cli.SCENARIOS.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(scenario.summary)}$",
                         listed.stdout, re.MULTILINE), name
        if isinstance(scenario, cli.Suite):
            assert all(isinstance(cli.SCENARIOS[m], cli.Timed) for m in scenario.members)
        else:
            module = importlib.import_module(f"bench.harness.{scenario.module}")
            assert callable(getattr(module, "run" if isinstance(scenario, cli.Timed)
                                    else "main"))


def test_run_sh_and_the_entry_scripts_reach_the_registry() -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}
    listed = subprocess.run(["bash", "bench/run.sh", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env=env)
    assert listed.returncode == 0 and "drain-fast" in listed.stdout, listed.stderr
    for argv in (["bench/drain.py"], ["bench/peers.py"], ["-m", "bench", "drain-slow"]):
        shown = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT,
                               capture_output=True, text=True, timeout=60, env=env)
        assert shown.returncode == 0 and "--stock-pg15" in shown.stdout, (argv, shown.stderr)


def test_missing_node_is_named_with_its_install_command(tmp_path: Path) -> None:
    out = harness("bloat", "--quick", "--reports", str(tmp_path), env={"PATH": str(tmp_path)})
    assert out.returncode == 2
    assert "apt-get install -y nodejs" in out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []  # checked first: nothing started, nothing written


def test_unknown_scenario_and_bad_procs_are_one_line_errors() -> None:
    out = subprocess.run(["bash", "bench/run.sh", "no-such"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT),
                              "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert out.returncode == 2 and "unknown scenario 'no-such'" in out.stderr
    out = harness("contention", "--procs", "0")
    assert out.returncode == 2 and "--procs must be at least 1" in out.stderr
    # Without a scenario, as SPEC writes `bench/run.sh [scenario] [--quick] ...`: throughput.
    out = harness("--procs", "0")
    assert out.returncode == 2 and "python -m bench throughput" in out.stderr
    assert "--procs must be at least 1" in out.stderr
    assert "Traceback" not in out.stderr


def test_contention_cell_accounts_for_every_claimed_row(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        destinations = [stack.add_destination(conn, f"http://127.0.0.1:9/{i}")
                        for i in range(3)]
    cell = contention.run_cell(dsn, destinations, procs=2, size=10, seconds=0.5)
    with psycopg.connect(dsn, autocommit=True) as conn:
        finished = conn.execute("SELECT count(*) FROM finished_deliveries").fetchone()
        left = conn.execute("SELECT count(*) FROM deliveries WHERE status = 'pending'"
                            ).fetchone()
        in_flight = conn.execute("SELECT count(*) FROM deliveries WHERE status <> 'pending'"
                                 ).fetchone()
    assert cell["claims"] > 0
    rows = round(cell["deliveries_per_s"] * cell["seconds"])
    # Every row a claimer got was marked delivered: none stays in flight, none is lost.
    assert finished is not None and abs(finished[0] - rows) <= 1
    assert in_flight == (0,)
    assert left is not None and left[0] + finished[0] == int(
        contention.BACKLOG_PER_S * 0.5)
    assert 0 < cell["fill_ratio"] <= 1
    assert cell["lock_samples"] >= 1


def test_ingest_ceiling_pgbench_row_is_an_event_row(dsn: str) -> None:
    """ingest-ceiling's pgbench script inserts into a copy of `events` as the schema has it
    now: the row it writes is an event's, with the payload the load tool posts."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {ingest_ceiling.PGBENCH_TABLE} (LIKE events INCLUDING ALL)")
        conn.execute(ingest_ceiling.PGBENCH_SCRIPT)
        row = conn.execute(
            f"SELECT type, payload, delivery_count, tenant_id FROM {ingest_ceiling.PGBENCH_TABLE}"
        ).fetchone()
    assert row == ("order.created", ingest_ceiling.PAYLOAD, 2, 1)
    assert json.loads(ingest_ceiling.PAYLOAD)["order"] == 42
    assert len(ingest_ceiling.PAYLOAD) == ingest_ceiling.PAYLOAD_BYTES - 5


def test_report_folder_holds_json_markdown_and_plots(tmp_path: Path) -> None:
    report = Report("unit", {"quick": True}, tmp_path)
    report.headline.append("one line")
    report.section("Numbers")
    report.table(["a", "b"], [[1, 2.5], [None, "x"]])
    fig, ax = figure("A plot")
    ax.plot([0, 1], [0, 1])
    report.plot(fig, "a.png", "A plot")
    folder = report.save()
    data = json.loads((folder / "report.json").read_text())
    assert data["scenario"] == "unit" and data["plots"] == ["a.png"]
    assert data["headline"] == ["one line"] and data["machine"]["cpus"]
    markdown = (folder / "report.md").read_text()
    assert "![A plot](a.png)" in markdown and "| - | x |" in markdown
    assert (folder / "a.png").read_bytes().startswith(b"\x89PNG")


def test_histogram_quantiles_from_metrics_text() -> None:
    def text(counts: list[int]) -> str:
        bounds = ["0.001", "0.01", "0.1", "+Inf"]
        return "\n".join(
            f'engine_claim_duration_seconds_bucket{{le="{b}",pid="1"}} {c}'
            for b, c in zip(bounds, counts, strict=True))

    before = stack.histogram(text([0, 10, 10, 10]), "engine_claim_duration_seconds")
    after = stack.histogram(text([0, 10, 109, 110]), "engine_claim_duration_seconds")
    found = stack.histogram_quantiles_ms(before, after)
    # 100 observations since `before`: 99 under 100 ms, 1 above.
    assert found == {"p50_le_ms": 100.0, "p99_le_ms": 100.0, "count": 100.0}
    assert stack.histogram_quantiles_ms(after, after)["p50_le_ms"] is None


empty_dsn = pytest.fixture(test_migrate.empty_dsn.__wrapped__, name="empty_dsn")


def test_partition_migration_history_survives_025_and_026(empty_dsn: str,
                                                           tmp_path: Path) -> None:
    """partition-migration's history, written at schema 024, is all there after 025 and
    026 (each finished delivery with its event and its attempt; every tenth event's key
    copied into idempotency_keys), in the legacy partitions."""
    migrate(empty_dsn, partition_migration.schema_up_to(tmp_path,
                                                        partition_migration.BEFORE_PARTITIONS))
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        destinations = [stack.add_destination(conn, f"http://127.0.0.1:9/{i}")
                        for i in range(3)]
    last_event, last_delivery = partition_migration.fill_history(empty_dsn, 2000, destinations)
    migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        counts = stack.run_sql(conn, partition_migration.HISTORY_COUNTS,
                               (last_event, last_delivery))[0]
        keys = conn.execute("SELECT count(*) FROM idempotency_keys").fetchone()
        legacy = conn.execute("SELECT count(*) FROM ONLY finished_deliveries_legacy"
                              ).fetchone()
    assert counts == (2000, 2000, 2000, 0, 0)
    assert keys == (200,) and legacy == (2000,)


def test_partition_migration_accounting() -> None:
    t0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)

    def at(ms: int, locks: tuple[str, ...]) -> partition_migration.MigratorSample:
        return partition_migration.MigratorSample(t0 + dt.timedelta(milliseconds=ms), 1, t0,
                                                  "active", "SELECT 1", locks)

    samples = [at(0, ()), at(10, ("events:AccessExclusiveLock",)),
               at(20, ("events:AccessExclusiveLock",)), at(30, ()),
               at(40, ("events:AccessExclusiveLock",))]
    holds = partition_migration.lock_holds(samples)
    assert [(h["lock"], h["seen_s"], h["at_most_s"]) for h in holds] == [
        ("events:AccessExclusiveLock", 0.01, 0.03), ("events:AccessExclusiveLock", 0.0, 0.02)]
    gaps = partition_migration.arrival_gaps([1000, 1100, 1900, 2500],
                                            {"a": (1.0, 2.0), "b": (2.0, 3.0)})
    assert gaps["a"]["longest_gap_ms"] == 800.0 and gaps["a"]["arrived"] == 3
    assert gaps["b"]["longest_gap_ms"] == 500.0 and gaps["b"]["arrived"] == 1
    lost = partition_migration.account([(1, 2), (2, 2), (3, 1)],
                                       {"d0": {"evt_1": 1, "evt_2": 1, "evt_3": 1},
                                        "d1": {"evt_1": 1}})
    assert lost["events_short"] == 1 and lost["events_short_sample"] == [2]
    assert lost["deliveries_expected"] == 5


def test_bloat_history_days_pass_by_drops_on_the_partitioned_schema(dsn: str) -> None:
    """bloat --history partitions: the database laid out in day partitions over the past
    days, seeded with history, loaded with soak_enqueue; the driver (this checkout's
    partition job, retention falling from 4.5 days) drops the day partitions wholly past
    the cutoff, the soak's rows stay; table_sample sums a partitioned table's partitions."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        stack.run_sql(conn, bloat_history.RELAYOUT, (6,))
        destinations = [stack.add_destination(conn, f"http://127.0.0.1:9/{i}")
                        for i in range(bloat.DESTINATIONS)]
    seeded = bloat_history.seed(dsn, 5, 40, destinations)
    assert seeded == {"events": 160, "finished_deliveries": 320, "delivery_attempts": 480}
    with psycopg.connect(dsn, autocommit=True) as conn:
        stack.run_sql(conn, bloat_history.SOAK_ENQUEUE, (10, destinations, 0, "{}", 2))
        assert conn.execute("SELECT count(*) FROM deliveries d JOIN events e ON e.id ="
                            " d.event_id AND e.created_at = d.created_at").fetchone() == (20,)
    proc = subprocess.Popen(
        [sys.executable, str(bloat_history.DRIVER), dsn, "--start-days", "3.5",
         "--day-seconds", "100000", "--every", "60"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())
    proc.terminate()
    assert proc.wait(30) == 0
    assert first["job"] == "partitions" and first["dropped"] >= 3
    with psycopg.connect(dsn, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM events WHERE created_at < now() - interval"
                            " '4.5 days'").fetchone()  # the day holding it ended before the cutoff
        rows = {r[0]: r for r in stack.run_sql(conn, bloat.TABLE_SAMPLE,
                                               (list(bloat_history.TABLES), []))}
        events = conn.execute("SELECT count(*) FROM events").fetchone()
    assert left == (0,) and events is not None and 10 < events[0] < 170
    assert set(rows) == set(bloat_history.TABLES)
    assert rows["events"][5] > 0  # heap bytes, summed over the partitions left

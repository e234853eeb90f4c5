"""The bench at a tiny size: the registry of scenarios, tool checks, one contention cell on
a real database, the report folder and the metrics parsing the scenarios rely on."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

from bench.harness import cli, contention, ingest_ceiling, stack
from bench.harness.report import Report, figure

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

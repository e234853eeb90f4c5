"""Autovacuum advice from a bloat report, and `engine tune-autovacuum REPORT [--apply]`
against a real database."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
from hypothesis import given
from hypothesis import strategies as st

from engine.observe.autovacuum_advice import Measured, advice_from_report, advise, nice_ceiling
from tests.kit.dbserver import leaves

ENGINE = [sys.executable, "-m", "engine.cli"]


def measured(table: str = "deliveries", **overrides: object) -> Measured:
    values: dict[str, object] = {
        "table": table, "dead_per_s": 500.0, "inserts_per_s": 150.0, "dead_peak": 30_000,
        "autovacuum_runs": 3, "vacuum_s": 0.5, "naptime_s": 60.0}
    values.update(overrides)
    return Measured(**values)  # type: ignore[arg-type]


def write_report(path: Path, rows: list[Measured]) -> Path:
    path.write_text(json.dumps({"scenario": "bloat",
                                "autovacuum_measured": [m.as_dict() for m in rows]}))
    return path


@given(st.floats(min_value=0, max_value=1e12, allow_nan=False))
def test_nice_ceiling_is_the_next_1_2_5_step(value: float) -> None:
    result = nice_ceiling(value)
    assert result >= value
    digits = str(result).rstrip("0")
    assert digits in {"1", "2", "5"}
    # No smaller step of the 1-2-5 series would do.
    smaller = result // 2 if digits in {"1", "2"} else result * 2 // 5
    assert smaller < value or result == 1


def test_hot_table_triggers_on_a_count_from_its_dead_tuple_rate() -> None:
    [advice] = advise([measured(dead_per_s=500, naptime_s=60, vacuum_s=0.5)])
    # 500 dead/s over a 60 s interval, half of it so each look finds the table due.
    assert advice.settings["autovacuum_vacuum_threshold"] == 20_000
    assert advice.settings["autovacuum_vacuum_scale_factor"] == 0
    assert "autovacuum_vacuum_cost_delay" not in advice.settings  # peak 30k < 2 x 30k
    assert advice.statement().startswith("ALTER TABLE deliveries SET (")
    assert len(advice.reasons) == 2 and all(advice.reasons)


def test_vacuum_falling_behind_runs_it_unthrottled() -> None:
    [advice] = advise([measured(dead_peak=200_000)])
    assert advice.settings["autovacuum_vacuum_cost_delay"] == 0
    assert "falls behind" in advice.reasons[1]


def test_a_slow_vacuum_stretches_the_interval() -> None:
    [fast] = advise([measured(vacuum_s=1)])
    [slow] = advise([measured(vacuum_s=100)])
    assert slow.settings["autovacuum_vacuum_threshold"] > fast.settings[
        "autovacuum_vacuum_threshold"]


def test_append_only_table_triggers_on_inserts_and_idle_table_gets_nothing() -> None:
    advice = advise([measured("delivery_attempts", dead_per_s=0, inserts_per_s=250),
                     measured("events", dead_per_s=0, inserts_per_s=0)])
    assert [a.table for a in advice] == ["delivery_attempts"]
    assert advice[0].settings == {"autovacuum_vacuum_insert_scale_factor": 0,
                                  "autovacuum_vacuum_insert_threshold": 100_000}


def test_report_without_measurements_is_one_clear_error(tmp_path: Path) -> None:
    for body, message in [("not json", "is not a JSON report"),
                          ('{"scenario": "contention"}', "no autovacuum measurements"),
                          ('{"autovacuum_measured": [{"table": 1}]}', "malformed")]:
        (tmp_path / "r.json").write_text(body)
        out = subprocess.run([*ENGINE, "tune-autovacuum", str(tmp_path / "r.json"),
                              "--dsn", "postgresql://127.0.0.1:9/none"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2
        assert message in out.stderr and "Traceback" not in out.stderr
        assert out.stdout == ""
    out = subprocess.run([*ENGINE, "tune-autovacuum", str(tmp_path / "missing.json")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "cannot read" in out.stderr


def test_command_prints_then_applies_the_statements(dsn: str, tmp_path: Path) -> None:
    report = write_report(tmp_path / "report.json", [
        measured(dead_peak=200_000),
        measured("delivery_attempts", dead_per_s=0, inserts_per_s=250)])
    printed = subprocess.run([*ENGINE, "tune-autovacuum", str(report), "--dsn", dsn],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    assert printed.strip() == "\n".join(a.text() for a in advice_from_report(report))

    def options() -> dict[str, list[str]]:
        """Each table's settings: delivery_attempts' are its partitions' (schema/026),
        every one of which must have them."""
        with psycopg.connect(dsn) as conn:
            found = {table: {tuple(row[0]) for row in conn.execute(
                "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE relname = ANY(%s)",
                (leaves(conn, table),)).fetchall()}
                for table in ("deliveries", "delivery_attempts")}
        assert all(len(kinds) == 1 for kinds in found.values()), found
        return {table: list(kinds.pop()) for table, kinds in found.items()}

    before = options()
    assert "autovacuum_vacuum_threshold=20000" not in before["deliveries"]  # printing only
    subprocess.run([*ENGINE, "tune-autovacuum", str(report), "--dsn", dsn, "--apply"],
                   capture_output=True, text=True, timeout=60, check=True)
    after = options()
    assert "autovacuum_vacuum_threshold=20000" in after["deliveries"]
    assert "autovacuum_vacuum_cost_delay=0" in after["deliveries"]
    assert "autovacuum_vacuum_insert_threshold=100000" in after["delivery_attempts"]


def test_behind_is_judged_against_the_soaks_own_trigger() -> None:
    # 500 dead/s, a 60 s naptime and a 5,000 trigger allow ~35,000: 60,000 is within twice.
    kept_up = advise([measured(dead_peak=60_000, trigger=5_000)])[0]
    assert "autovacuum_vacuum_cost_delay" not in kept_up.settings
    behind = advise([measured(dead_peak=80_000, trigger=5_000)])[0]
    assert behind.settings["autovacuum_vacuum_cost_delay"] == 0


def test_no_autovacuum_in_the_soak_says_so() -> None:
    [advice] = advise([measured(autovacuum_runs=0, dead_peak=10**6)])
    assert "no autovacuum ran" in advice.reasons[1]
    assert "autovacuum_vacuum_cost_delay" not in advice.settings


def test_a_lower_trigger_is_kept_and_a_long_naptime_is_called_out() -> None:
    # 500 dead/s: one 60 s naptime makes 30,000, six times the soak's 5,000 trigger.
    table, server = advise([measured(trigger=5_000)])
    assert table.settings["autovacuum_vacuum_threshold"] == 5_000  # not raised to 20,000
    assert server.table is None
    assert server.settings == {"autovacuum_naptime": "20s"}  # 2 x 5,000 / 500 per s
    assert server.statement() == "ALTER SYSTEM SET autovacuum_naptime = '20s';"
    [alone] = advise([measured(trigger=5_000, naptime_s=10)])  # looks often enough
    assert alone.table == "deliveries"

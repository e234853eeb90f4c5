"""Delivery workers run at a lower CPU priority than ingress (`--worker-nice`), so that
accepting events keeps answering fast while the workers deliver on the same cores."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from engine.config import ConfigError, load_settings
from tests.kit.enginerun import Engine, wait_until


@pytest.mark.parametrize("worker_nice", [7, 0])
def test_worker_children_run_at_the_configured_niceness(
    dsn: str, tmp_path: Path, worker_nice: int
) -> None:
    with Engine(
        dsn, tmp_path, "--procs", "2", "--ingress-procs", "1", "--bind", "127.0.0.1:0",
        "--worker-nice", str(worker_nice),
    ) as engine:
        wait_until(lambda: len(engine.worker_pids()) == 2, 30, "two workers")
        supervisor_nice = psutil.Process(engine.pid).nice()
        expected = min(19, supervisor_nice + worker_nice)
        # The worker sets its niceness first thing in its role entry, just after the fork.
        wait_until(
            lambda: engine.sample_workers(engine.worker_pids(), psutil.Process.nice)
            == [expected, expected],
            10, f"workers at niceness {expected}",
        )
        # Ingress and maintenance are forked after the workers: wait for all four (with
        # --worker-nice 0 the wait above can end before they exist).
        def all_four() -> list[psutil.Process] | None:
            found = psutil.Process(engine.pid).children()
            return found if len(found) == 4 else None

        children = wait_until(all_four, 30, "all four children")
        others = {child.pid for child in children} - set(engine.worker_pids())
        assert len(others) == 2  # ingress and maintenance keep the supervisor's priority
        assert {psutil.Process(pid).nice() for pid in others} == {supervisor_nice}


def test_worker_nice_from_file_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "engine.toml"
    config.write_text("worker_nice = 5\n")
    assert load_settings().worker_nice == 10
    assert load_settings(config).worker_nice == 5
    monkeypatch.setenv("ENGINE_WORKER_NICE", "3")
    assert load_settings(config).worker_nice == 3
    assert load_settings(config, worker_nice=0).worker_nice == 0
    with pytest.raises(ConfigError, match="worker_nice"):
        load_settings(worker_nice=20)
    monkeypatch.setenv("ENGINE_WORKER_NICE", "high")
    with pytest.raises(ConfigError, match="ENGINE_WORKER_NICE"):
        load_settings()

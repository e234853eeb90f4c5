"""`engine demo` from an empty folder: exits 0 with deliveries made, and leaves no process
behind (the embedded database, the engine and its children are all stopped)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.kit.enginerun import ROOT


@pytest.fixture
def empty_folder() -> Iterator[Path]:
    # Not pytest's tmp_path: concurrent pytest runs remove old numbered folders.
    folder = Path(tempfile.mkdtemp(prefix="engine-demo-test-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def processes_using(folder: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        info = proc.info
        if str(folder) in " ".join(info["cmdline"] or []) or (info["cwd"] or "").startswith(
            str(folder)
        ):
            found.append(proc)
    return found


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ENGINE_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_demo_from_an_empty_folder(empty_folder: Path) -> None:
    env = environment()
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli", "demo", "--duration", "10"],
        cwd=empty_folder, env=env, capture_output=True, text=True, timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    # Not a terminal: plain progress lines, then the summary.
    progress = [line for line in proc.stdout.splitlines() if "accepted=" in line]
    assert progress, proc.stdout
    summary = re.search(r"(\d+) events accepted, (\d+) deliveries delivered", proc.stdout)
    assert summary is not None, proc.stdout
    assert int(summary[1]) > 0 and int(summary[2]) > 0
    assert "engine status" in proc.stdout
    for name in ("healthy", "slow", "flaky", "gone", "dead"):
        assert name in proc.stdout
    assert (empty_folder / ".engine" / "pgdata" / "PG_VERSION").exists()
    assert not (empty_folder / ".engine" / "pgdata" / "postmaster.pid").exists()
    assert processes_using(empty_folder) == []


def start_long_demo(folder: Path, stderr: int) -> subprocess.Popen[str]:
    """`engine demo` for ten minutes in `folder`, its stdout read by the caller."""
    return subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "demo", "--duration", "600"],
        cwd=folder, env=environment(), stdout=subprocess.PIPE, stderr=stderr,
        text=True, stdin=subprocess.DEVNULL,
    )


def test_ctrl_c_stops_the_demo_with_a_summary(empty_folder: Path) -> None:
    demo = start_long_demo(empty_folder, subprocess.PIPE)
    try:
        assert demo.stdout is not None
        seen = []
        for line in demo.stdout:  # the first progress line: everything is running
            seen.append(line)
            if "accepted=" in line:
                break
        assert any("accepted=" in line for line in seen), seen
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, (out, err)
    assert "interrupted" in out and "events accepted" in out
    assert "Traceback" not in err
    assert processes_using(empty_folder) == []


def test_a_killed_demo_takes_its_engine_with_it(empty_folder: Path) -> None:
    """SIGKILL leaves the demo no chance to stop anything: the engine it started (in a
    session of its own, out of Ctrl-C's reach) stops by itself when its parent dies
    (engine/cli/parent_link.py)."""
    demo = start_long_demo(empty_folder, subprocess.DEVNULL)
    try:
        assert demo.stdout is not None
        for line in demo.stdout:  # the first progress line: the engine is running
            if "accepted=" in line:
                break
        engines = [child for child in psutil.Process(demo.pid).children()
                   if "engine.cli" in " ".join(child.cmdline()) and "demo" not in child.cmdline()]
        assert len(engines) == 1, engines
        demo.kill()
        demo.wait()
        _, alive = psutil.wait_procs(engines, timeout=120)
        assert not alive, f"the engine outlived its killed demo: {alive}"
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        # The embedded database the demo started is left running by design of SIGKILL;
        # stopped here (fast shutdown), as the test started it.
        for proc in processes_using(empty_folder):
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.name() == "postgres" and "-D" in proc.cmdline():
                    proc.send_signal(signal.SIGINT)
        psutil.wait_procs(processes_using(empty_folder), timeout=60)
    assert processes_using(empty_folder) == []

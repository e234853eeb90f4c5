"""Run `python -m engine.cli` as a real subprocess for a test, and read its JSON log."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import psutil

from engine.testing.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
EXIT_LOGGED_WITHIN_S = 10.0  # the supervisor reaps and logs a dead child within this


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class Engine:
    """`engine --dsn DSN ...` for the length of a `with` block; stderr goes to a file."""

    def __init__(self, dsn: str, log_dir: Path, *args: str) -> None:
        self.argv = [sys.executable, "-m", "engine.cli", "--dsn", dsn, *args]
        self.log_path = log_dir / "engine.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:  # pytest shows captured output next to the failure
            print(f"--- engine log ({self.log_path}) ---\n{self.log_path.read_text()}")
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            children = psutil.Process(proc.pid).children(recursive=True)
            stop_process(proc, 20)
            for child in children:  # only if the supervisor itself failed to end them
                if child.is_running():
                    child.kill()
        if exc is None:
            self.assert_no_callback_raised()

    def assert_no_callback_raised(self) -> None:
        """The engine survives an exception in its own HTTP result callback (it logs one
        `http_client_fault` and counts the rest), but it is always a bug: in a test it
        fails the test. One such hid for long: a result that raised leaked its slot."""
        raised = [r for r in self.events("http_client_fault") if r.get("kind") == "on_done"]
        assert not raised, f"the engine's result callback raised: {raised}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        records = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if name is None or record.get("event") == name:
                    records.append(record)
        return records

    def worker_pids(self) -> list[int]:
        """Worker children started and not yet reported dead."""
        started, exited = [], set()
        for record in self.events():
            if record.get("role") != "worker":
                continue
            if record["event"] in ("child_started", "child_restarted"):
                started.append(record["child"])
            elif record["event"] == "child_exited":
                exited.add(record["child"])
        return [pid for pid in started if pid not in exited]

    def worker_exits(self) -> list[dict[str, Any]]:
        """The supervisor's child_exited records of workers, in order."""
        return [r for r in self.events("child_exited") if r.get("role") == "worker"]

    def assert_no_worker_exited(self) -> None:
        """Fail with what the supervisor saw ("worker 1687 exited: SIGABRT after 25.3 s")
        if any worker exited."""
        exits = self.worker_exits()
        assert not exits, "; ".join(describe_exit(r) for r in exits)

    def sample_workers(self, pids: Iterable[int], measure: Callable[[psutil.Process], T]
                       ) -> list[T]:
        """`measure` of each worker process. A worker that is gone fails the test with its
        exit as the supervisor logged it, not with psutil's NoSuchProcess."""
        try:
            return [measure(psutil.Process(pid)) for pid in pids]
        except psutil.NoSuchProcess as exc:
            gone = exc.pid
        record = wait_until(
            lambda: next((r for r in self.worker_exits() if r["child"] == gone), None),
            EXIT_LOGGED_WITHIN_S, f"the supervisor to log the exit of worker {gone}, gone")
        raise AssertionError(describe_exit(record))

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)


def describe_exit(record: dict[str, Any]) -> str:
    """"worker 1687 exited: SIGABRT after 25.3 s" from a child_exited record."""
    how = record.get("signal") or f"exit code {record.get('exit_code')}"
    return f"{record.get('role', 'worker')} {record['child']} exited: {how} after " \
           f"{record.get('lived_s')} s"

"""The supervisor's restart backoff, on real processes (README, Reliability: "It restarts a
child that dies (backing off when one keeps dying)"). The policy is engine/supervisor.py's:
a child that lived less than HEALTHY_AFTER_S (10 s) before dying counts as failing, and
each such failure in a row doubles the wait before its next start, from 0.5 s up to 30 s;
one that lived longer is restarted at once.

A real `engine --procs 1`; its worker is killed with SIGKILL each time it comes back, and
the waits are read from the supervisor's own log: from each `child_exited` to the
`child_restarted` after it."""

from __future__ import annotations

import datetime as dt
import os
import signal
from pathlib import Path
from typing import Any

from tests.kit.enginerun import Engine, wait_until

# The waits after the 1st..5th quick death in a row: 0.5 s doubled each time.
EXPECTED_WAITS_S = [0.5, 1.0, 2.0, 4.0, 8.0]
# A restart never comes before its wait (the log's timestamps are to the millisecond)...
EARLY_S = 0.02
# ...and comes within this much after it: the supervisor's loop sleeps until the next
# start is due, but a loaded 2-core machine may run it late. Less than the difference
# between two successive waits, so a wait that did not double cannot pass for one.
LATE_S = 0.45
HEALTHY_AFTER_S = 10.0
# A child that lived HEALTHY_AFTER_S is not failing: it comes back without a wait.
AT_ONCE_S = 0.3


def test_a_worker_that_keeps_dying_is_restarted_after_doubling_waits(
    dsn: str, tmp_path: Path
) -> None:
    with Engine(dsn, tmp_path, "--procs", "1", "--bind", "127.0.0.1:0") as engine:
        wait_until(lambda: engine.worker_pids(), 30, "the worker to start")
        killed: list[int] = []
        for expected in EXPECTED_WAITS_S:
            killed.append(_kill_worker(engine, restart_within=expected + 10))
        waits = _restart_waits(engine, killed)
        print(f"\nrestart waits {[round(w, 3) for w in waits]} expected {EXPECTED_WAITS_S}")
        for number, (wait, expected) in enumerate(zip(waits, EXPECTED_WAITS_S, strict=True), 1):
            assert expected - EARLY_S <= wait <= expected + LATE_S, (
                f"quick death {number}: restarted after {wait:.3f} s, the policy says "
                f"{expected} s; all waits: {[round(w, 3) for w in waits]}")
        lived = [e["lived_s"] for e in _worker_events(engine, "child_exited")]
        assert all(s < HEALTHY_AFTER_S for s in lived), lived

        # One that lived past HEALTHY_AFTER_S is healthy again: no wait before its restart.
        [survivor] = engine.worker_pids()
        started = _worker_events(engine, "child_restarted")[-1]
        assert started["child"] == survivor
        wait_until(lambda: _age_s(engine, started) > HEALTHY_AFTER_S + 0.5,
                   HEALTHY_AFTER_S + 10, "the worker to live past HEALTHY_AFTER_S")
        killed.append(_kill_worker(engine, restart_within=10))
        [wait] = _restart_waits(engine, killed[-1:])
        assert wait < AT_ONCE_S, f"a worker that had lived {HEALTHY_AFTER_S} s waited {wait} s"
        # Only the worker died: ingress and maintenance were never restarted.
        restarted = {e["role"] for e in engine.events("child_restarted")}
        assert restarted == {"worker"}, restarted


def _kill_worker(engine: Engine, restart_within: float) -> int:
    [pid] = engine.worker_pids()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: any(p != pid for p in engine.worker_pids()), restart_within,
               f"a new worker after killing {pid}")
    return pid


def _worker_events(engine: Engine, name: str) -> list[dict[str, Any]]:
    return [e for e in engine.events(name) if e.get("role") == "worker"]


def _restart_waits(engine: Engine, killed: list[int]) -> list[float]:
    """Seconds from the `child_exited` of each killed pid to the next `child_restarted`."""
    events = [e for e in engine.events() if e.get("role") == "worker"
              and e["event"] in ("child_exited", "child_restarted")]
    waits = []
    for pid in killed:
        at = next(i for i, e in enumerate(events)
                  if e["event"] == "child_exited" and e["child"] == pid)
        exited = events[at]
        restarted = next(e for e in events[at + 1:] if e["event"] == "child_restarted")
        waits.append((_ts(restarted) - _ts(exited)).total_seconds())
    return waits


def _ts(event: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(event["ts"])


def _age_s(engine: Engine, started: dict[str, Any]) -> float:
    return (dt.datetime.now(dt.UTC) - _ts(started)).total_seconds()

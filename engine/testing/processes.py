"""Ending the child processes that tests, the bench and tools start."""

from __future__ import annotations

import signal
import subprocess


def stop_process(proc: subprocess.Popen, *grace_s: float) -> None:
    """SIGTERM, the signal an operator sends (the engine drains, a fake destination writes
    its stats), once for each grace period the process has not ended within; then
    SIGKILL. The engine takes a second SIGTERM as "exit at once"."""
    for grace in grace_s:
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            continue
    if proc.poll() is None:
        proc.kill()
        proc.wait()

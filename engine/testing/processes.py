"""Ending the child processes that tests, the bench and tools start."""

from __future__ import annotations

import signal
import subprocess


def stop_process(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM, the signal an operator sends (the engine drains, a fake destination writes
    its stats); SIGKILL if the process has not ended after `grace_s`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

"""Helper threads for tests: whatever a thread raises fails the test that started it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence


def run_threads(
    targets: Sequence[Callable[[], object]], timeout: float,
    stop: threading.Event | None = None,
) -> None:
    """Run each target in its own thread and wait for all of them. Re-raise the first
    exception any of them raised (noting how many failed); a thread still running after
    `timeout` seconds fails the test too, rather than being left behind unnoticed. `stop`,
    if given, is set as soon as one raises, so that the others can give up early."""
    errors: list[BaseException] = []
    lock = threading.Lock()

    def guarded(target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:
            with lock:
                errors.append(exc)
            if stop is not None:
                stop.set()

    threads = [threading.Thread(target=guarded, args=(t,), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if errors:
        first = errors[0]
        first.add_note(f"({len(errors)} of {len(threads)} helper threads raised)")
        raise first
    running = sum(thread.is_alive() for thread in threads)
    assert running == 0, f"{running} of {len(threads)} helper threads still running " \
                         f"after {timeout}s"

"""What `engine.db.migrate.migrate` reports while a bench times it (tenant-migration,
partition-migration): each file's duration and when it ran, in seconds from the
migration's start, and each lock_timeout that fired (the file is then tried again)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any


class MigrationLog:
    """`progress` and `gave_up` are migrate()'s callbacks. `applied_at(name)` says when a
    file was applied (monotonic seconds; a bench may record a mark of its own there)."""

    def __init__(self, start: float,
                 applied_at: Callable[[str], float] = lambda name: time.monotonic()) -> None:
        self.start = start
        self.last = start
        self.applied_at = applied_at
        self.migrations: list[dict[str, Any]] = []
        self.lock_timeouts: list[dict[str, Any]] = []

    def progress(self, name: str, seconds: float) -> None:
        now = self.applied_at(name)
        self.migrations.append({"name": name, "seconds": round(seconds, 3),
                                "start_s": round(self.last - self.start, 3),
                                "end_s": round(now - self.start, 3)})
        print(f"applied {name} in {seconds:.3f} s", file=sys.stderr)
        self.last = now

    def gave_up(self, name: str, attempt: int) -> None:
        self.lock_timeouts.append({"name": name, "attempt": attempt,
                                   "at_s": round(time.monotonic() - self.start, 3)})
        print(f"{name}: lock_timeout fired on try {attempt}", file=sys.stderr)

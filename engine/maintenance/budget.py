"""The time budget of a maintenance job's run: the batched jobs (breaker_defer.py,
fold_minutes.py, retention.py) move rows a short transaction at a time until a batch
comes back short, the budget is spent, or the process stops leading; the rest waits for
the next run."""

from __future__ import annotations

import time
from collections.abc import Callable


def within_budget(budget_s: float, keep_going: Callable[[], bool]) -> Callable[[], bool]:
    """A `keep_going` for engine.db.database.repeat_until_short: true while `keep_going()`
    and until `budget_s` from now."""
    deadline = time.monotonic() + budget_s
    return lambda: time.monotonic() < deadline and keep_going()

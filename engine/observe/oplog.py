"""Operator log: one JSON line on stderr per event worth an operator's attention."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from collections import Counter


def log_event(event: str, **fields: object) -> None:
    record = {
        "ts": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        "event": event,
        "pid": os.getpid(),
        **fields,
    }
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    sys.stderr.flush()


class Outage:
    """One database outage as two log lines, not one per failed request or retry: the
    first failure logs `database_unavailable`, later failures are only counted, and the
    first success afterwards logs `database_recovered` with how long it lasted and how
    many operations failed meanwhile, by what they were doing. One per process and
    component."""

    def __init__(self, component: str, **fields: object) -> None:
        self.component = component
        self.fields = fields
        self.since: float | None = None
        self.failures: Counter[str] = Counter()
        self.last_error = ""

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def failed(self, error: object, during: str) -> None:
        self.failures[during] += 1
        self.last_error = str(error).strip()
        if self.since is None:
            self.since = time.monotonic()
            log_event("database_unavailable", component=self.component, during=during,
                      error=self.last_error, **self.fields)

    def recovered(self) -> None:
        if self.since is None:
            return
        log_event("database_recovered", component=self.component,
                  down_s=round(time.monotonic() - self.since, 3),
                  failures=dict(self.failures), last_error=self.last_error, **self.fields)
        self.since = None
        self.failures.clear()

"""Operator log: one JSON line on stderr per event worth an operator's attention."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys


def log_event(event: str, **fields: object) -> None:
    record = {
        "ts": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        "event": event,
        "pid": os.getpid(),
        **fields,
    }
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    sys.stderr.flush()

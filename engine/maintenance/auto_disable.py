"""Auto-disable: destinations whose attempts have all failed for `disable_after` are
disabled, with an operational event (engine/sql/maintenance/auto_disable.sql)."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import Connection

from engine.db import queries
from engine.db.sql_params import AutoDisableParams


@dataclass(frozen=True)
class AutoDisableSettings:
    disable_after_s: float
    # Often enough that a short disable_after (tests, demos) is honoured within seconds;
    # the statement reads only the small destinations table.
    interval_s: float = 2.0


@dataclass
class AutoDisableReport:
    disabled: int
    operational_events: int


def run_once(conn: Connection, settings: AutoDisableSettings) -> AutoDisableReport:
    params = AutoDisableParams(disable_after_seconds=settings.disable_after_s)
    with conn.transaction():
        row = queries.AUTO_DISABLE.run_sync(conn, params).fetchone()
    assert row is not None
    return AutoDisableReport(disabled=int(row[0]), operational_events=int(row[1]))

"""Breaker deferral: due deliveries of destinations whose breaker is open move to the end
of the pause, out of the claim's way (engine/sql/maintenance/breaker_defer.sql)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from psycopg import Connection

from engine.db import queries
from engine.db.database import repeat_until_short
from engine.db.sql_params import BreakerDeferParams
from engine.maintenance.budget import within_budget

BREAKER_DEFER_BATCH = 1000
BREAKER_DEFER_BUDGET_S = 5.0


@dataclass(frozen=True)
class BreakerDeferSettings:
    interval_s: float = 2.0
    batch: int = BREAKER_DEFER_BATCH
    budget_s: float = BREAKER_DEFER_BUDGET_S


@dataclass
class BreakerDeferReport:
    deferred: int


def defer_open_breakers(
    conn: Connection, batch: int = BREAKER_DEFER_BATCH,
    budget_s: float = BREAKER_DEFER_BUDGET_S, keep_going: Callable[[], bool] = lambda: True,
) -> int:
    """Move due deliveries of open-breaker destinations to the end of their pause, a
    batch per short transaction, for at most `budget_s`."""
    params = BreakerDeferParams(batch_limit=batch)

    def one_batch() -> int:
        with conn.transaction():
            return queries.BREAKER_DEFER.run_sync(conn, params).rowcount

    return repeat_until_short(one_batch, batch, within_budget(budget_s, keep_going))[0]


def run_once(conn: Connection, settings: BreakerDeferSettings,
             keep_going: Callable[[], bool]) -> BreakerDeferReport:
    return BreakerDeferReport(deferred=defer_open_breakers(
        conn, settings.batch, settings.budget_s, keep_going))

"""Folding the console's rollup: each worker session writes its own delivery_minutes rows
(no worker waits on another's row lock); once a minute is two minutes old its rows are
folded into one per minute and destination (engine/sql/maintenance/fold_delivery_minutes.sql)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from psycopg import Connection

from engine.db import queries
from engine.db.database import repeat_until_short
from engine.db.sql_params import FoldDeliveryMinutesParams
from engine.maintenance.budget import within_budget

FOLD_MINUTES_BATCH = 5000
FOLD_MINUTES_BUDGET_S = 5.0


@dataclass(frozen=True)
class FoldMinutesSettings:
    # Every 15 s keeps the unfolded rows to about three minutes' worth per worker and
    # destination.
    interval_s: float = 15.0
    batch: int = FOLD_MINUTES_BATCH
    budget_s: float = FOLD_MINUTES_BUDGET_S


@dataclass
class FoldMinutesReport:
    folded: int


def fold_delivery_minutes(
    conn: Connection, batch: int = FOLD_MINUTES_BATCH,
    budget_s: float = FOLD_MINUTES_BUDGET_S, keep_going: Callable[[], bool] = lambda: True,
) -> int:
    """Fold the per-writer delivery_minutes rows of finished minutes, a batch per short
    transaction, for at most `budget_s`; returns the rows folded away."""
    params = FoldDeliveryMinutesParams(batch_limit=batch)

    def one_batch() -> int:
        with conn.transaction():
            row = queries.FOLD_DELIVERY_MINUTES.run_sync(conn, params).fetchone()
        return int(row[0]) if row else 0

    return repeat_until_short(one_batch, batch, within_budget(budget_s, keep_going))[0]


def run_once(conn: Connection, settings: FoldMinutesSettings,
             keep_going: Callable[[], bool]) -> FoldMinutesReport:
    return FoldMinutesReport(folded=fold_delivery_minutes(
        conn, settings.batch, settings.budget_s, keep_going))

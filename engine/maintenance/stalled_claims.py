"""Stalled claims: the sessions of workers frozen in the middle of a pipelined claim are
ended, under the leader, so that what the claim took is free again within the same bound
as an idle claim transaction (engine/sql/maintenance/end_stalled_claims.sql says why the
server's own timeouts do not cover them)."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import Connection

from engine.db import queries
from engine.db.database import IDLE_IN_TRANSACTION_TIMEOUT_MS
from engine.db.sql_params import EndStalledClaimsParams


@dataclass(frozen=True)
class StalledClaimsSettings:
    stalled_after_ms: int = IDLE_IN_TRANSACTION_TIMEOUT_MS
    # Every tick: the check reads pg_stat_activity only, and the bound it keeps is seconds.
    interval_s: float = 1.0


@dataclass
class StalledClaimsReport:
    ended: int
    pids: list[int]


def end_stalled_claims(conn: Connection, stalled_after_ms: int) -> list[int]:
    """End worker sessions stalled mid-transaction for `stalled_after_ms`; their pids."""
    params = EndStalledClaimsParams(stalled_after_ms=stalled_after_ms)
    rows = queries.END_STALLED_CLAIMS.run_sync(conn, params).fetchall()
    return [int(pid) for pid, ended in rows if ended]


def run_once(conn: Connection, settings: StalledClaimsSettings) -> StalledClaimsReport:
    pids = end_stalled_claims(conn, settings.stalled_after_ms)
    return StalledClaimsReport(ended=len(pids), pids=pids)

"""Which database the engine uses, connections to it, and running our statements on them.

`--dsn`, else ENGINE_DSN, else DATABASE_URL (folded into Settings.dsn by config), else an
embedded PostgreSQL with its data under `./.engine/`.

`repeat_until_short` runs a bounded batch, each its own short transaction, until one
moves fewer rows than the batch size (the statements themselves: engine/db/queries.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from engine.config import Settings
from engine.db.embedded import EmbeddedServer, ensure_server


@dataclass
class Database:
    dsn: str
    embedded: EmbeddedServer | None = None

    def close(self) -> None:
        """Stop the embedded server if this process started it."""
        if self.embedded is not None:
            self.embedded.stop()


# Settings every session the engine opens starts with (docs/decisions/
# 0008-no-jit-on-engine-sessions.md says why). JIT: the hot statements are short, and
# where the server has JIT (Debian's, PGDG's and most managed builds) their cost estimates
# cross jit_above_cost as the queue grows, so every execution compiles them again, at
# several times the database CPU of the statement itself.
SESSION_SETTINGS = {"jit": "off"}


def engine_conninfo(dsn: str) -> str:
    """`dsn` with SESSION_SETTINGS as startup options: the server applies them before the
    first statement, with no round trip, on every connection made from the result (the
    supervisor hands this one string to every process and pool). Options the DSN or
    PGOPTIONS already carry are kept and come after ours, so an operator's explicit
    choice wins."""
    params = conninfo_to_dict(dsn)
    ours = " ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS.items())
    # libpq reads PGOPTIONS only when the conninfo has no `options`, so merge it here.
    theirs = params.get("options") or os.environ.get("PGOPTIONS", "")
    params["options"] = f"{ours} {theirs}".strip()
    return make_conninfo(**params)


def open_database(settings: Settings, *, announce: bool = True) -> Database:
    """The database the engine uses; its `dsn` carries the engine's session settings."""
    if settings.dsn:
        return Database(engine_conninfo(settings.dsn))
    server = ensure_server(settings.data_dir / "pgdata")
    if announce:
        how = "started" if server.started_here else "reusing"
        print(
            f"engine: no --dsn, ENGINE_DSN or DATABASE_URL: {how} the embedded PostgreSQL "
            f"with data in {server.data_dir} ({server.dsn})",
            file=sys.stderr,
        )
    return Database(engine_conninfo(server.dsn), server)


# Server-side bounds on the engine's queue sessions (claims, results, reaping), so that no
# transaction holding claimed rows or locks can outlive a frozen, starved or cut-off
# process: the server ends the session itself, its transaction rolls back, and the rows
# are claimable again at once (instead of after the lease, or never while it holds them).
# A transaction of ours is open only while a statement runs or between the statements of
# one pipelined claim. The two bounds cover all of that but one state: a worker frozen
# between the sends of its pipelined claim leaves the session `active`, waiting for the
# client, which neither timeout ends before PostgreSQL 17; the maintenance leader ends
# those sessions after the same bound (engine/sql/maintenance/end_stalled_claims.sql).
IDLE_IN_TRANSACTION_TIMEOUT_MS = 5_000
# Generous: the statements are milliseconds when healthy; this is for a claim that waits
# on a lock or a plan gone wrong, which must fail (and be retried) rather than hold
# everything it has locked so far.
STATEMENT_TIMEOUT_MS = 30_000


# The queue sessions run only the hot statements (claim, capped locks, rate tokens, result
# write, refill), prepared by psycopg after a few executions. Left to choose, PostgreSQL
# kept planning several of them anew on every execution (a custom plan), a tenth of its
# CPU; their generic plans are the ones tests/test_claim_plan.py checks beside the custom
# ones (docs/decisions/0018-generic-plans-on-queue-sessions.md).
QUEUE_PLAN_CACHE_MODE = "force_generic_plan"


def session_options(dsn: str) -> str:
    """libpq `options` for the engine's queue sessions: the bounds above and generic
    plans, then the DSN's own options, set in the startup packet (no extra round trip; a
    reconnect keeps them). As in engine_conninfo, the DSN's come last, so an operator's
    explicit choice (a shorter statement_timeout, say) wins over ours; a database- or
    role-level setting does not, since startup options outrank those."""
    given = conninfo_to_dict(dsn).get("options") or ""
    ours = (f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_MS}"
            f" -c statement_timeout={STATEMENT_TIMEOUT_MS}"
            f" -c plan_cache_mode={QUEUE_PLAN_CACHE_MODE}")
    return f"{ours} {given}".strip()


def worker_dsn(dsn: str, synchronous_commit: bool) -> str:
    """The DSN of a delivery worker's sessions: without `synchronous_commit`, their
    commits do not wait for the WAL to reach the disk. A worker's writes are claims and
    results, and a server crash that loses the last of them only sends those deliveries
    again, as a lost worker does (at least once); record_results.sql still waits for a
    batch that finishes an ordered delivery, whose loss could send it again after the
    next in its order (docs/decisions/0037). Accepting an event (ingress) always waits.
    The DSN's own options come after ours, so an operator's choice there wins."""
    if synchronous_commit:
        return dsn
    given = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"-c synchronous_commit=off {given}".strip())


def describe(dsn: str) -> str:
    """`user@host:port/dbname` for messages: never the password."""
    params = conninfo_to_dict(dsn)
    user = params.get("user") or "(default user)"
    host = params.get("host") or "(local socket)"
    port = f":{params['port']}" if params.get("port") else ""
    return f"{user}@{host}{port}/{params.get('dbname') or user}"


def _always() -> bool:
    return True


def repeat_until_short(
    run_batch: Callable[[], int], batch: int, keep_going: Callable[[], bool] = _always,
) -> tuple[int, bool]:
    """Call `run_batch` (one short transaction that moves at most `batch` rows and says how
    many it moved) while `keep_going()`, until a batch comes back short. Returns the rows
    moved and whether it finished (False: `keep_going` stopped it first)."""
    total = 0
    while keep_going():
        moved = run_batch()
        total += moved
        if moved < batch:
            return total, True
    return total, False

"""The queue's lock key spaces and batch sizes, and giving claims back on a synchronous
connection: the supervisor for a worker process that exited, the reaper for leases that
ran out. Everything else the queue does runs on asyncio connections: engine/db/queue_async.py.
Each operation is one engine/sql/ statement (engine/db/queries.py) in short transactions."""

from __future__ import annotations

from psycopg import Connection

from engine.db import queries
from engine.db.database import repeat_until_short
from engine.db.sql_params import ReturnClaimsParams
from engine.domain import BreakerSettings, Claim, EventIn, Result, worker_id

# Re-exported: tests, bench and tools name the domain types through engine.db.queue.
__all__ = ["BreakerSettings", "Claim", "EventIn", "Result", "worker_id"]

# pg_advisory_xact_lock(class, destination id) key space: "changing this destination's
# slot count or breaker" (claims for a capped destination, result writes, the reaper: see
# lock_capped_destinations.sql and record_results.sql). Two-int keys never collide with the
# one-bigint keys used elsewhere.
BREAKER_LOCK_CLASS = 0x656E68
# One key space for both: a result write takes one lock per destination for its breaker
# and its slot counter together.
CAPPED_CLAIM_LOCK_CLASS = BREAKER_LOCK_CLASS
# Capped destinations one claim locks at most (lock_capped_destinations.sql): each lock is
# held until the claim commits, and other claimers and result writes of those destinations
# wait for it. A claim that locked this many may have left others with room and due work:
# its commit wakes every claimer (engine/queue_async.claim_batch).
CAPPED_LOCKS_PER_CLAIM = 32
# pg_advisory_xact_lock(class, tenant id) key space: "changing this tenant's slot count or
# next send time" (claims for a tenant with limits of its own, result writes, the reaper:
# lock_limited_tenants.sql). Its own class: tenant and destination ids overlap.
TENANT_LOCK_CLASS = 0x656E74
# Limited tenants one claim locks at most (lock_limited_tenants.sql), as for capped
# destinations: each lock is held until the claim commits.
LIMITED_TENANTS_PER_CLAIM = 16
RETURN_BATCH = 1000
REPLAY_BATCH = 500


def release_claims(conn: Connection, worker: str, max_attempts: int) -> int:
    """Return every claim of `worker` (a process that died) to pending at once."""
    return return_claims(conn, worker, False, "worker exited", max_attempts)


def return_claims(
    conn: Connection, worker: str | None, only_expired: bool, reason: str, max_attempts: int
) -> int:
    """Return claims to pending, RETURN_BATCH per transaction: every claim of `worker`
    (None: any holder), or only those whose lease ran out."""
    params = ReturnClaimsParams(
        locked_by=worker, only_expired=only_expired, reason=reason, max_attempts=max_attempts,
        batch_limit=RETURN_BATCH, advisory_lock_class=BREAKER_LOCK_CLASS,
        tenant_advisory_lock_class=TENANT_LOCK_CLASS,
    )

    def one_batch() -> int:
        with conn.transaction():
            row = queries.RETURN_CLAIMS.run_sync(conn, params).fetchone()
        return int(row[0]) + int(row[1]) if row else 0

    return repeat_until_short(one_batch, RETURN_BATCH)[0]

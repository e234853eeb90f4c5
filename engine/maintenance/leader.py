"""Leadership of the cluster's maintenance: one session advisory lock, one holder.

The lock lives as long as the session that took it, so leadership cannot outlive its
holder: a killed process closes its socket and the server releases the lock at once; a
host that vanishes (no FIN) or a frozen process stops its heartbeat, and the server ends
the idle session after `idle_session_timeout`, releasing the lock within seconds. A
follower retries `pg_try_advisory_lock` every poll and takes over.
"""

from __future__ import annotations

import psycopg

from engine.db import queries
from engine.db.sql_params import LeaderSessionTimeoutParams, LockKeyParams

# pg_advisory_lock key naming "engine maintenance leader" (one-bigint key space).
LEADER_LOCK_KEY = 0x656E67696E656C  # "engineL"
# The server ends the leader's session after this much silence; heartbeats come far more
# often (every maintenance tick), so only a dead or frozen leader hits it.
IDLE_SESSION_TIMEOUT_S = 10


class Leadership:
    """A dedicated connection that holds (or tries to take) the leader lock."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None

    def try_acquire(self) -> bool:
        """Take the lock if it is free; True while this process holds it."""
        if self._conn is not None:
            return self.heartbeat()
        conn = psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=5,
            application_name="engine maintenance leader",
            # TCP keepalives end a session on a dead network path even mid-query.
            keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=2,
        )
        try:
            queries.LEADER_SESSION_TIMEOUT.run_sync(conn, LeaderSessionTimeoutParams(
                idle_session_timeout=f"{IDLE_SESSION_TIMEOUT_S}s"))
            row = queries.LEADER_TRY_LOCK.run_sync(
                conn, LockKeyParams(lock_key=LEADER_LOCK_KEY)).fetchone()
        except psycopg.Error:
            conn.close()
            raise
        if row and row[0]:
            self._conn = conn
            return True
        conn.close()
        return False

    def heartbeat(self) -> bool:
        """Prove the session (and with it the lock) is still alive; False if it is lost."""
        if self._conn is None:
            return False
        try:
            queries.SESSION_ALIVE.run_sync(self._conn)
            return True
        except psycopg.Error:
            self.release()
            return False

    def release(self) -> None:
        """Closing the session releases the lock."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

"""Reaper: claims whose lease ran out (a lost host) go back to pending, under the leader.
(A worker that dies on a live host has its claims returned by its supervisor at once:
queue.release_claims.)"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import Connection

from engine.db import queue


@dataclass(frozen=True)
class ReaperSettings:
    max_attempts: int
    interval_s: float = 5.0


@dataclass
class ReaperReport:
    returned: int


def reap_expired(conn: Connection, max_attempts: int) -> int:
    """Return claims whose lease ran out to pending; how many."""
    return queue.return_claims(conn, None, True, "lease expired", max_attempts)


def run_once(conn: Connection, settings: ReaperSettings) -> ReaperReport:
    return ReaperReport(returned=reap_expired(conn, settings.max_attempts))

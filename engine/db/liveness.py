"""Is an idle database connection still usable? Checked before a connection that may have
sat idle is used, so that a connection a database restart broke never reaches a request
or a result: the server says goodbye (an error message, then EOF) to every session when
it stops, so a connection it closed has something to read although we asked nothing.

A poll() with no timeout costs no round trip, unlike `SELECT 1`. It does not see a
peer that vanished without a word (a cut cable); statement and session timeouts and the
failed statement itself cover that case.
"""

from __future__ import annotations

import select

import psycopg


def closed_by_server(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """True when `conn`, idle and not LISTENing, is closed or has unasked-for input (the
    server's goodbye). Only for connections that receive no notifications: for those a
    pending notification would look the same."""
    if conn.closed or conn.broken:
        return True
    # poll, not select: a worker with hundreds of HTTP connections has descriptors
    # above select's FD_SETSIZE (1024).
    poller = select.poll()
    try:
        poller.register(conn.pgconn.socket, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.OperationalError):
        return True

"""The worker's database connections: opened with the engine's session options, retried
through outages until the drain deadline.

Two connections per process: the claim loop's claims and LISTENs for new work
(notifications that arrive during a claim wait in psycopg's backlog, so none is missed),
the recorder's records results, so a slow flush never delays the next claim, and vice
versa.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from engine.db.database import session_options
from engine.db.queries import NOTIFY_CHANNEL
from engine.observe.oplog import Outage

RECONNECT_DELAY_S = 1.0


class DatabaseGone(Exception):
    """The drain deadline passed while the database could not be reached."""


class DrainDeadline:
    """Until when a worker keeps retrying the database: for ever until its drain begins
    (`at`, monotonic time), then until the drain deadline."""

    def __init__(self) -> None:
        self.at = math.inf

    def give_up_if_passed(self) -> None:
        if time.monotonic() > self.at:
            raise DatabaseGone


async def connect(
    dsn: str, worker: str, *, listen: bool, outage: Outage, give_up: Callable[[], None],
) -> psycopg.AsyncConnection:
    """Connect, retrying every RECONNECT_DELAY_S; `give_up` raises DatabaseGone once the
    worker is draining and past its deadline (DrainDeadline.give_up_if_passed)."""
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, application_name=f"engine worker {worker}",
                options=session_options(dsn),
            )
            if listen:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))
            return conn
        except psycopg.OperationalError as exc:
            outage.failed(exc, "connect")
            give_up()
            await asyncio.sleep(RECONNECT_DELAY_S)

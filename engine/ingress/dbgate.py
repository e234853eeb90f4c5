"""Ingress's pooled database connections, and its view of whether the database is up.

Three promises during and after a database outage:
- 503 at once while the database cannot be reached: once a connection attempt has
  failed, a request is refused after one probe (a connection attempt shared by every
  request that comes while it runs, PROBE_CONNECT_TIMEOUT_S at most), never after a wait
  for the pool (whose wait is for a busy pool, not a dead server); the first request after
  the database is back is served, not refused until the prober's next turn;
- the truth on /healthz within a second of the database coming back: a probe connects
  every PROBE_INTERVAL_S while it is down, whether or not requests arrive;
- no connection a restart broke ever reaches a request: each one is checked before use
  (engine/db/liveness.py), and when the database comes back the pool is replaced by a fresh
  one. psycopg_pool would otherwise keep retrying its own connections with an exponential
  backoff (1 s, 2 s, 4 s…) and make requests wait for it long after the server is back.

Each outage is two lines in the operator log (engine/oplog.Outage), not one per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import psycopg
import psycopg_pool

from engine.db import queries
from engine.db.liveness import closed_by_server
from engine.ingress import errors
from engine.observe.oplog import Outage

POOL_TIMEOUT_S = 3.0
POOL_MAX = 4
PROBE_INTERVAL_S = 0.2
PROBE_CONNECT_TIMEOUT_S = 2
APPLICATION_NAME = "engine ingress"


class DatabaseGate:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.outage = Outage("ingress")
        self.pool: psycopg_pool.AsyncConnectionPool | None = None
        self._prober: asyncio.Task[None] | None = None
        self._request_probe: asyncio.Future[bool] | None = None
        self._closing: set[asyncio.Task[None]] = set()  # old pools being closed
        self._renewing = asyncio.Lock()

    @property
    def down(self) -> bool:
        return self.outage.ongoing

    async def open(self) -> None:
        # The pool's own reconnection warnings would be one line per attempt; the outage
        # is reported once by self.outage instead.
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        self.pool = self._new_pool()
        # Do not wait: with the database down the server still starts and answers 503,
        # at once from the first request on if this first probe fails.
        await self.pool.open(wait=False)
        self._prober = asyncio.create_task(self._check_at_start())

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
        await asyncio.gather(*self._closing, return_exceptions=True)
        if self.pool is not None:
            await self.pool.close()

    def _new_pool(self) -> psycopg_pool.AsyncConnectionPool:
        return psycopg_pool.AsyncConnectionPool(
            self.dsn, min_size=1, max_size=POOL_MAX,
            kwargs={"autocommit": True, "application_name": APPLICATION_NAME},
            open=False, timeout=POOL_TIMEOUT_S, name="ingress",
        )

    def lost(self, error: object, during: str) -> None:
        """The database could not be reached: refuse requests until a probe connects."""
        self.outage.failed(error, during)
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe_until_up())

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        if not await self.available():
            raise errors.unavailable()
        pool, conn = await self._checked_connection()
        try:
            yield conn
        except psycopg.OperationalError as exc:
            if conn.broken or conn.closed:  # not a statement timeout: the session is gone
                self.lost(exc, "request")
            raise
        finally:
            await pool.putconn(conn)

    async def _checked_connection(
        self,
    ) -> tuple[psycopg_pool.AsyncConnectionPool, psycopg.AsyncConnection]:
        assert self.pool is not None
        pool = self.pool
        try:
            conn = await pool.getconn()
        except psycopg_pool.PoolTimeout:
            # A busy pool, or one that cannot connect: only a connection attempt tells.
            await self._probe_or_raise()
            raise
        if not closed_by_server(conn):
            return pool, conn
        # The server closed it: it restarted (or is stopping). Every other idle connection
        # of the pool is as stale; if the server is up again, start over with a new pool.
        await conn.close()
        await pool.putconn(conn)
        await self._probe_or_raise()
        await self._renew(pool)
        assert self.pool is not None
        return self.pool, await self.pool.getconn()

    async def _probe_or_raise(self) -> None:
        try:
            await self._probe()
        except psycopg.OperationalError as exc:
            self.lost(exc, "probe")
            raise errors.unavailable() from None

    async def available(self) -> bool:
        """Whether a request may use the database: it is not known to be down, or a probe
        run now (or the one under way, joined) connects, which ends the outage."""
        if not self.down:
            return True
        if self._request_probe is None or self._request_probe.done():
            self._request_probe = asyncio.ensure_future(self._probe_once())
        return await asyncio.shield(self._request_probe)

    async def _probe_once(self) -> bool:
        try:
            await self._probe()
        except psycopg.OperationalError as exc:
            self.outage.failed(exc, "probe")
            return False
        await self._back_up()
        return True

    async def _back_up(self) -> None:
        """A probe connected: new pool, outage over (once, whichever probe saw it first)."""
        if not self.down:
            return
        assert self.pool is not None
        await self._renew(self.pool)
        self.outage.recovered()

    async def _probe(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, connect_timeout=PROBE_CONNECT_TIMEOUT_S,
            application_name=f"{APPLICATION_NAME} probe",
        )
        async with conn:
            await queries.SESSION_ALIVE.run(conn)

    async def _renew(self, stale: psycopg_pool.AsyncConnectionPool) -> None:
        """Replace `stale` by a fresh pool (once, however many requests found it stale)."""
        async with self._renewing:
            if self.pool is not stale:
                return
            fresh = self._new_pool()
            await fresh.open(wait=False)
            self.pool = fresh
            task = asyncio.create_task(stale.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _check_at_start(self) -> None:
        try:
            await self._probe()
        except psycopg.OperationalError as exc:
            self.outage.failed(exc, "probe")
            await self._probe_until_up()

    async def _probe_until_up(self) -> None:
        while self.down:
            await asyncio.sleep(PROBE_INTERVAL_S)
            if self.down:
                await self._probe_once()

"""The worker's own claim and record path, for tests that drive it one step at a time.

DeliveryWorker (engine/worker/loop.py) claims with queue_async.claim_batch on its claim
connection, and its recorder (engine/worker/recorder.py) writes results with
queue_async.record_results, or queue_async.record_results_and_refill when the batch
refills capped slots or asks for spares, on a second connection. Both are opened by
engine.worker.connection.connect: autocommit, the engine's session options (generic
plans, the timeouts). `WorkerPath` opens the same two connections on an event loop of
its own (uvloop, as run_worker_process runs the worker) and runs those same functions
with the arguments the worker passes them, one call at a time, from synchronous test
code. The claim connection does not LISTEN: nothing here reads notifications, and they
would pile up in its backlog (the claim itself is the same either way).

`answer` builds a claim's Result as the worker does (engine.worker.outcome), so that it
carries the claim's token.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import psycopg
import uvloop

from engine.db import queue_async
from engine.domain import BreakerSettings, Claim, Result
from engine.observe.oplog import Outage
from engine.worker import outcome
from engine.worker.connection import connect
from engine.worker.http.transfer import HttpResult

T = TypeVar("T")


def _never_give_up() -> None:
    """connect()'s `give_up`: a test's worker is never past a drain deadline."""


class WorkerPath:
    """One worker's claim and record connections and the production functions on them."""

    def __init__(self, dsn: str, worker: str, *, lease_ms: int, breaker: BreakerSettings,
                 setup: Iterable[str] = ()) -> None:
        self.worker = worker
        self.lease_ms = lease_ms
        self.tenant_cursor = queue_async.TenantCursor()  # as DeliveryWorker keeps it
        self.breaker = breaker
        self.runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        outage = Outage("worker", worker=worker)
        self.claim_conn: psycopg.AsyncConnection = self.run(connect(
            dsn, worker, listen=False, outage=outage, give_up=_never_give_up))
        self.record_conn: psycopg.AsyncConnection = self.run(connect(
            dsn, worker, listen=False, outage=outage, give_up=_never_give_up))
        for statement in setup:
            self.execute(statement)

    def run(self, awaitable: Awaitable[T]) -> T:
        return self.runner.run(_awaited(awaitable))

    def execute(self, statement: str, params: Sequence[object] = ()) -> None:
        """Run a session statement (search_path, a setting) on both connections."""
        for conn in (self.claim_conn, self.record_conn):
            self.run(conn.execute(statement, params))  # type: ignore[arg-type]

    def claim(self, limit: int, reserve: int = 0, left_out: Sequence[int] = (),
              announce_backlog: bool = False) -> list[Claim]:
        """DeliveryWorker._claim_loop's claim: queue_async.claim_batch(claim_conn, worker,
        limit, lease_ms, reserve, left_out, announce_backlog=..., tenant_cursor=...)."""
        return self.run(queue_async.claim_batch(
            self.claim_conn, self.worker, limit, self.lease_ms, reserve, list(left_out),
            announce_backlog=announce_backlog, tenant_cursor=self.tenant_cursor))

    def record(self, results: Sequence[Result]) -> int:
        """ResultRecorder._record without slots to refill: how many results applied."""
        return self.run(queue_async.record_results(
            self.record_conn, self.worker, list(results), self.breaker))

    def record_and_refill(self, results: Sequence[Result], refill: Mapping[int, int],
                          spares: Mapping[int, int] = {}) -> list[Claim]:
        """ResultRecorder._record with slots to refill or spares to claim: the claims
        the write took."""
        return self.run(queue_async.record_results_and_refill(
            self.record_conn, self.worker, list(results), self.lease_ms, dict(refill),
            self.breaker, dict(spares)))

    def on_claim_conn(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        """Run `work` with the claim connection (e.g. inside a transaction of its own)."""
        return self.run(work(self.claim_conn))

    def close(self) -> None:
        try:
            for conn in (self.claim_conn, self.record_conn):
                self.run(conn.close())
        finally:
            self.runner.close()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def answer(claim: Claim, status: int, started_at: dt.datetime, schedule: Sequence[float], *,
           now: dt.datetime | None = None, rng: random.Random | None = None,
           duration_ms: float = 1.0, body: bytes = b"") -> Result:
    """The Result of an HTTP answer with `status` to `claim`, as the worker makes it
    (outcome.response_result): delivered, retry or dead per `schedule`, gone for a 410;
    with the claim's token. `now`: the time the worker makes it, from which a retry's
    delay runs (default: `started_at`)."""
    response = HttpResult(status, body, None, duration_ms, None, started_at.timestamp())
    made_at = started_at if now is None else now
    return outcome.response_result(claim, response, schedule, now=lambda: made_at, rng=rng)


def released(claim: Claim, at: dt.datetime | None = None) -> Result:
    """A claim given back unsent, as the worker releases it (outcome.released)."""
    return outcome.released(claim) if at is None else outcome.released(claim, lambda: at)

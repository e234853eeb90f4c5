"""Group commit: durable acceptance at the cost of one commit per batch of requests.

Requests are written together — every event and all its deliveries, in ONE statement, so
one transaction and one round trip — and each request is answered only after that
commit. Then a NOTIFY wakes the workers (after the commit, so they find the rows),
debounced to at most one per few milliseconds.

Batching is natural, with no timer: a request that finds no commit running is committed
at once; the requests that arrive while a commit runs wait for it and go together in the
next one. The batch grows with the load, and a lone request waits for nobody.

A second committer slot (its own connection) joins in only when many events wait (batch
requests): one commit then gathers while the other executes, using a second core of the
database server. For single events it would halve the batches and double the commits,
which costs more CPU per event than it saves latency (docs/decisions/0024).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg
from psycopg.errors import NumericValueOutOfRange, UntranslatableCharacter
from psycopg.types.array import ListBinaryDumper
from psycopg.types.string import StrBinaryDumper

from engine.db import queries, queue_async
from engine.db.liveness import closed_by_server
from engine.db.sql_params import AcceptFindKeysParams, DestinationIdsParams
from engine.domain import EventIn
from engine.ingress import errors
from engine.ingress.errors import ApiError
from engine.ingress.schemas import EventAccepted
from engine.observe.oplog import Outage
from engine.webhooks.routing import payload_is_filterable

if TYPE_CHECKING:
    from engine.ingress.dbgate import DatabaseGate

log = logging.getLogger(__name__)

# A fixed window only delays a lone request (natural batching needs none); tests set one.
DEFAULT_WINDOW_S = 0.0
DEFAULT_MAX_EVENTS = 2000
DEFAULT_SLOTS = 2
# A further slot starts a commit while another runs only when this many events wait.
PARALLEL_COMMIT_EVENTS = 256
NOTIFY_INTERVAL_S = 0.005
# Beyond this many events waiting for a commit, refuse (503) rather than queue without
# bound: the database is not keeping up and the clients should back off.
DEFAULT_MAX_WAITING_EVENTS = 50_000
CONNECT_TIMEOUT_S = 5
# Test hook, only active when set: sleep this long after a commit before answering, so a
# test can kill the process between the two.
PAUSE_AFTER_COMMIT_ENV = "ENGINE_INGRESS_TEST_PAUSE_AFTER_COMMIT_S"

@dataclass(eq=False)
class Submission:
    """One request's events (one for POST /v1/events, many for the batch endpoint)."""

    events: Sequence[EventIn]
    future: asyncio.Future[list[EventAccepted]] = field(repr=False)


class _Reject(Exception):
    """Some submissions of a batch must be refused after the write: roll back, retry the
    others."""

    def __init__(self, refused: dict[Submission, ApiError]) -> None:
        super().__init__("refused submissions")
        self.refused = refused


class Committer:
    def __init__(
        self, dsn: str, *, window_s: float = DEFAULT_WINDOW_S,
        max_events: int = DEFAULT_MAX_EVENTS, slots: int = DEFAULT_SLOTS,
        max_waiting_events: int = DEFAULT_MAX_WAITING_EVENTS,
        gate: DatabaseGate | None = None,
    ) -> None:
        self.dsn = dsn
        # With a gate (the app's), an outage it knows of is refused at once and reported
        # once by it. `outage` reports commits that fail on a live session (statement
        # timeouts), and lost sessions too when there is no gate.
        self.gate = gate
        self.outage = Outage("ingress commit")
        self.max_waiting_events = max_waiting_events
        self.window_s = window_s
        self.max_events = max_events
        self.slot_count = slots
        self.pause_after_commit_s = float(os.environ.get(PAUSE_AFTER_COMMIT_ENV) or 0)
        self._waiting: collections.deque[Submission] = collections.deque()
        self._waiting_events = 0
        self._committing = 0
        # Set when a request arrives or a commit ends: a slot then looks again.
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._notify_wanted = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.on_commit: list = []  # callbacks(batch_requests, batch_events, seconds)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._slot()) for _ in range(self.slot_count)]
        self._tasks.append(asyncio.create_task(self._notifier()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while self._waiting:
            submission = self._waiting.popleft()
            if not submission.future.done():
                submission.future.set_exception(errors.unavailable("ingress is shutting down"))

    async def submit(self, events: Sequence[EventIn]) -> list[EventAccepted]:
        """Queue events for the next group commit; returns once they are committed."""
        if self._waiting_events + len(events) > self.max_waiting_events and self._waiting:
            raise errors.unavailable("too many events are waiting for a commit; retry later")
        future: asyncio.Future[list[EventAccepted]] = asyncio.get_running_loop().create_future()
        self._waiting.append(Submission(events, future))
        self._waiting_events += len(events)
        self._wake.set()
        if self._waiting_events >= self.max_events:
            self._full.set()
        return await future

    def _take(self) -> list[Submission]:
        batch: list[Submission] = []
        taken = 0
        while self._waiting and (not batch or taken + len(self._waiting[0].events)
                                 <= self.max_events):
            submission = self._waiting.popleft()
            taken += len(submission.events)
            batch.append(submission)
        self._waiting_events -= taken
        if self._waiting_events < self.max_events:
            self._full.clear()
        return batch

    async def _slot(self) -> None:
        conn: psycopg.AsyncConnection | None = None
        try:
            while True:
                while not self._waiting or (
                    self._committing and self._waiting_events < PARALLEL_COMMIT_EVENTS
                ):
                    self._wake.clear()
                    await self._wake.wait()
                if self.window_s > 0 and self._waiting_events < self.max_events:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._full.wait(), self.window_s)
                else:
                    # One loop pass: requests read in the same pass as the one that woke
                    # us join this commit rather than wait for the next (decision 0024).
                    await asyncio.sleep(0)
                batch = self._take()
                if not batch:
                    continue
                self._committing += 1
                try:
                    conn = await self._commit(conn, batch)
                finally:
                    self._committing -= 1
                    self._wake.set()
        finally:
            if conn is not None:
                await conn.close()

    async def _commit(
        self, conn: psycopg.AsyncConnection | None, batch: list[Submission]
    ) -> psycopg.AsyncConnection | None:
        """Write and answer one batch; returns the connection to keep (None if broken)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        if self.gate is not None and not await self.gate.available():
            _fail(batch, errors.unavailable())
            return conn
        try:
            if conn is not None and closed_by_server(conn):
                # Idle through a restart: a new session, rather than a 503 for this batch.
                await conn.close()
                conn = None
            if conn is None:
                conn = await self._connect("engine ingress commit")
            answers, notify = await self._write_routed(conn, batch)
        except psycopg.OperationalError as exc:
            # The connection or the server failed (or a statement timeout cancelled the
            # write): nobody's events are known to be written.
            _fail(batch, errors.unavailable())
            if conn is None or conn.broken or conn.closed:
                self._lost(exc, "commit")
            else:  # a statement timeout, say: the database is up but cannot commit
                self.outage.failed(exc, "commit")
            if conn is not None:
                await conn.close()
            return None
        except psycopg.Error:
            if len(batch) == 1:
                log.exception("ingress commit refused a request that passed validation")
                _fail(batch, errors.invalid("the database refused this request"))
                return conn
            # Should not happen after validation; make sure one bad request cannot fail
            # the others by writing each on its own.
            log.exception("ingress group commit failed; retrying request by request")
            for submission in batch:
                conn = await self._commit(conn, [submission])
            return conn
        except Exception:
            log.exception("ingress commit failed")
            _fail(batch, errors.internal())
            return conn
        self.outage.recovered()
        if self.pause_after_commit_s:
            await asyncio.sleep(self.pause_after_commit_s)
        for submission, answer in answers.items():
            if not submission.future.done():
                if isinstance(answer, ApiError):
                    submission.future.set_exception(answer)
                else:
                    submission.future.set_result(answer)
        elapsed = loop.time() - started
        for callback in self.on_commit:
            callback(len(batch), sum(len(s.events) for s in batch), elapsed)
        if notify:
            self._notify_wanted.set()
        return conn

    async def _notifier(self) -> None:
        """Wakes the workers after commits: at most one NOTIFY per NOTIFY_INTERVAL_S,
        always one after the last commit. Many small commits would otherwise make every
        worker claim many tiny batches, which costs more CPU than it saves latency."""
        conn: psycopg.AsyncConnection | None = None
        try:
            while True:
                await self._notify_wanted.wait()
                self._notify_wanted.clear()
                try:
                    if conn is not None and closed_by_server(conn):
                        await conn.close()
                    if conn is None or conn.closed:
                        conn = await self._connect("engine ingress notify")
                    await queue_async.notify_deliveries(conn)
                except psycopg.Error as exc:
                    # Workers also poll; a lost wake-up only delays delivery a little.
                    log.warning("the wake-up after a commit failed: %s", exc)
                    if conn is not None:
                        await conn.close()
                    conn = None
                await asyncio.sleep(NOTIFY_INTERVAL_S)
        finally:
            if conn is not None:
                await conn.close()

    def _lost(self, error: psycopg.OperationalError, during: str) -> None:
        if self.gate is not None:
            self.gate.lost(error, during)
        else:
            self.outage.failed(error, during)

    async def _connect(self, name: str) -> psycopg.AsyncConnection:
        conn = await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
            application_name=name,
        )
        # Binary parameters: the text array format escapes every payload character by
        # character in Python (7x slower for 25 payloads of 1 KB).
        conn.adapters.register_dumper(list, ListBinaryDumper)
        conn.adapters.register_dumper(str, StrBinaryDumper)
        return conn

    async def _write_routed(
        self, conn: psycopg.AsyncConnection, batch: list[Submission]
    ) -> tuple[dict[Submission, list[EventAccepted] | ApiError], bool]:
        """`_write_retrying`, once more if PostgreSQL could not parse a payload as jsonb for
        a filtered destination: the payloads it cannot hold are then marked, match no
        filter, and are written like the others (engine/webhooks/routing.py). The failed
        statement wrote nothing (one statement, or a transaction rolled back)."""
        try:
            return await self._write_retrying(conn, batch)
        except (NumericValueOutOfRange, UntranslatableCharacter):
            for submission in batch:
                for event in submission.events:
                    event.filterable = payload_is_filterable(event.payload)
            return await self._write_retrying(conn, batch)

    async def _write_retrying(
        self, conn: psycopg.AsyncConnection, batch: list[Submission]
    ) -> tuple[dict[Submission, list[EventAccepted] | ApiError], bool]:
        """Write a batch; returns each submission's answer and whether any delivery was
        created (so workers need waking)."""
        answers: dict[Submission, list[EventAccepted] | ApiError] = {}
        listed = {d for s in batch for e in s.events for d in e.destination_ids or ()}
        if listed:
            # Refused before anything is written. A destination deleted between this check
            # and the insert simply gets no delivery (the insert skips deleted ones).
            cursor = await queries.ACCEPT_FIND_DESTINATIONS.run(
                conn, DestinationIdsParams(destination_ids=list(listed)))
            # A destination of another tenant is "unknown" to this one: the answer must not
            # tell it apart from one that does not exist.
            found = {(row[1], row[0]) for row in await cursor.fetchall()}
            for submission in batch:
                unknown = sorted(
                    {(e.tenant_id, d) for e in submission.events for d in e.destination_ids or ()}
                    - found
                )
                if unknown:
                    answers[submission] = errors.invalid(
                        f"destination_ids: unknown or deleted destination {unknown[0][1]}"
                    )
        remaining = [s for s in batch if s not in answers]
        # The insert is one statement, hence atomic and durable on its own: in autocommit
        # it is one round trip. Only a multi-event request with idempotency keys needs an
        # explicit transaction, so that a key conflict in it can undo its other events.
        atomic = any(
            len(s.events) > 1 and any(e.idempotency_key for e in s.events) for s in remaining
        )
        notify = False
        while remaining:
            if not atomic:
                written, conflicts, notify = await self._write(conn, remaining)
                answers.update(written)
                answers.update(conflicts)  # single events: nothing of theirs was written
                break
            try:
                async with conn.transaction():
                    written, conflicts, notify = await self._write(conn, remaining)
                    if conflicts:
                        raise _Reject(conflicts)
                answers.update(written)
                break
            except _Reject as reject:
                # Rolled back: refuse those, write the rest again.
                answers.update(reject.refused)
                remaining = [s for s in remaining if s not in answers]
        return answers, notify

    async def _write(
        self, conn: psycopg.AsyncConnection, batch: list[Submission]
    ) -> tuple[dict[Submission, list[EventAccepted]], dict[Submission, ApiError], bool]:
        """Insert every event of `batch`; returns the answers, the submissions whose
        Idempotency-Key was used before with a different request, and whether any
        delivery was created."""
        events = [e for s in batch for e in s.events]
        rows = await queue_async.enqueue_events(conn, events)
        repeated = sorted({
            (e.tenant_id, e.idempotency_key or "")
            for e, (event_id, _) in zip(events, rows, strict=True) if event_id is None
        })
        first_answers: dict[tuple[int, str], tuple[int, int, bytes]] = {}
        if repeated:
            cursor = await queries.ACCEPT_FIND_KEYS.run(conn, AcceptFindKeysParams(
                tenant_ids=[t for t, _ in repeated], idempotency_keys=[k for _, k in repeated]))
            for tenant_id, key, event_id, count, request_hash in await cursor.fetchall():
                first_answers[(tenant_id, key)] = (event_id, count, bytes(request_hash or b""))
        results: dict[Submission, list[EventAccepted]] = {}
        conflicts: dict[Submission, ApiError] = {}
        position = 0
        for submission in batch:
            accepted: list[EventAccepted] = []
            for event in submission.events:
                event_id, count = rows[position]
                position += 1
                if event_id is None:
                    first = first_answers.get((event.tenant_id, event.idempotency_key or ""))
                    if first is None or first[2] != event.request_hash:
                        conflicts[submission] = errors.conflict(
                            f"Idempotency-Key {event.idempotency_key!r} was already used"
                            " with a different request"
                        )
                    else:
                        event_id, count = first[0], first[1]
                accepted.append(EventAccepted(event_id or 0, count))
            if submission not in conflicts:
                results[submission] = accepted
        created = any(count for event_id, count in rows if event_id is not None)
        return results, conflicts, created


def _fail(batch: Sequence[Submission], error: ApiError) -> None:
    for submission in batch:
        if not submission.future.done():
            submission.future.set_exception(error)

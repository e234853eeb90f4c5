"""DNS pinning at connect time, through a real delivery worker: the README promises that a
destination's name is resolved, the address checked against the target policy, and that
address pinned for the connection, so DNS cannot be rebound in between.

The worker runs in this process (real database, real HTTP over loopback) with a stand-in
for the system resolver: its lookup knows pinned.invalid as 127.0.0.1, which no system
resolver does (`.invalid`, RFC 6761). Loopback is allowed by an allow-list (with
--allow-private-targets nothing is checked, so nothing is pinned). The deliveries can
reach the fake destination only at the address the worker checked and pinned; without the
pin curl resolves the name itself and every attempt fails with `dns`.

A second test covers the pin of a request started from the cached check (no lookup of its
own) on a multi handle that never saw the name: curl keeps a pin in its multi's DNS cache,
so on the handle that looked the name up an unpinned request would still arrive there.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable

import psycopg
import uvloop

from engine.config import load_settings
from engine.testing.fakedest import FakeDestination
from engine.worker import DeliveryWorker
from engine.worker.http.client import HttpResult
from engine.worker.http.pools import CurlPools
from tests.kit.data import add_destination, count, enqueue, finished
from tests.kit.httpserver_helpers import (
    PINNED_HOST,
    ScriptedServer,
    assert_system_cannot_resolve,
    loopback_lookup,
    scripted_server,
)
from tests.kit.workers import SCHEDULE

TOTAL = 20
DEADLINE_S = 60.0


def test_worker_delivers_to_the_address_it_checked_and_pinned(
    conn: psycopg.Connection, dsn: str
) -> None:
    assert_system_cannot_resolve(PINNED_HOST)
    settings = load_settings(allow_targets="127.0.0.0/8", retry_schedule=SCHEDULE,
                             breaker_threshold=1000)

    async def deliver_all(worker: DeliveryWorker) -> None:
        running = asyncio.ensure_future(worker.run())
        deadline = time.monotonic() + DEADLINE_S
        try:
            while worker.dispatcher.answered < TOTAL and not running.done():
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{worker.dispatcher.answered} of {TOTAL} requests answered"
                        f" in {DEADLINE_S} s")
                await asyncio.sleep(0.01)
        finally:
            worker.begin_drain()
            await running  # records what was answered, and raises what the worker raised

    with FakeDestination() as fake:
        destination = add_destination(conn, url=f"http://{PINNED_HOST}:{fake.port}/fast/pinned")
        enqueue(conn, [f'{{"n": {i}}}' for i in range(TOTAL)], [destination])
        uvloop.run(deliver_all(DeliveryWorker(settings, dsn, "pin-test", lookup=loopback_lookup)))
        stats = fake.name_stats("pinned")
        kept = fake.requests("pinned")
    errors = conn.execute("SELECT error, count(*) FROM delivery_attempts GROUP BY 1").fetchall()
    assert finished(conn, destination) == TOTAL, f"attempts by error: {errors}"
    assert (stats.get("delivered_ids"), stats.get("duplicates")) == (TOTAL, 0), stats
    assert {entry["headers"]["host"] for entry in kept} == {f"{PINNED_HOST}:{fake.port}"}
    assert count(conn, "SELECT count(*) FROM delivery_attempts WHERE error IS NOT NULL") == 0


def test_a_request_started_from_the_cached_check_on_another_pool_is_pinned() -> None:
    """CurlPools with a spread of 1: a host's second request while its first is open goes
    to another pool, whose multi handle never resolved the name. The first request's lookup
    is done by then, so the second starts at once from the cached check, and arrives only
    if that start pins the address too."""
    assert_system_cannot_resolve(PINNED_HOST)
    allowed = (ipaddress.ip_network("127.0.0.0/8"),)
    headers = ["content-type: application/json"]

    async def two(server: ScriptedServer) -> list[HttpResult | None]:
        pools = CurlPools(2, spread=1, lookup=loopback_lookup)
        results: list[HttpResult | None] = []
        base = f"http://{PINNED_HOST}:{server.server_address[1]}"
        deadline = time.monotonic() + 10

        async def until(what: str, done: Callable[[], bool]) -> None:
            while not done():
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                await asyncio.sleep(0.01)

        try:
            pools.start_checked(f"{base}/gate", headers, b"{}", 10_000, allowed, results.append)
            # The first arrived (its lookup is done) and stays open.
            await until("the first request", lambda: len(server.requests) == 1 or results)
            assert not results, f"the first request, with a lookup of its own: {results}"
            pools.start_checked(f"{base}/ok", headers, b"{}", 10_000, allowed, results.append)
            assert sorted(pool.in_flight for pool in pools.pools) == [1, 1]
            await until("the second request's result", lambda: len(results) == 1)
            server.gate.set()
            await until("the first request's result", lambda: len(results) == 2)
            return results
        finally:
            await pools.close()

    with scripted_server() as server:
        second, first = uvloop.run(two(server))
        paths = [path for path, _, _ in server.requests]
    assert second is not None and (second.status_code, second.error) == (200, None), (
        f"the request started from the cached check: {second}")
    assert first is not None and first.ok, first
    assert paths == ["/gate", "/ok"]

"""CurlPools: a worker's requests over several multi handles, a host's spread over them
only once `spread` of them are in flight in one (engine/worker/http/pools.py)."""

import asyncio
from collections.abc import Iterator

import pytest
import uvloop

from engine.worker.http.client import HttpResult, host_port
from engine.worker.http.pools import CurlPools
from tests.kit.httpserver_helpers import ScriptedServer, assert_loopback, scripted_server

HEADERS = ["content-type: application/json", "Expect:"]


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with scripted_server() as running:
        yield running


def start(pools: CurlPools, url: str) -> asyncio.Future[HttpResult | None]:
    """Begin one POST; the future gets what on_done got."""
    done: asyncio.Future[HttpResult | None] = asyncio.get_running_loop().create_future()
    pools.start_checked(assert_loopback(url), HEADERS, b"{}", 5000, True, done.set_result)
    return done


def per_pool(pools: CurlPools) -> list[int]:
    return [pool.in_flight for pool in pools.pools]


async def until(condition, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def spread_of_gated(server: ScriptedServer, capacity: int, spread: int, n: int) -> tuple[
        list[int], list[int | None], dict, int]:
    """Start `n` requests that wait at the server's gate and read how CurlPools(capacity,
    spread) spreads them over its pools; then open the gate. Returns that spread, the
    statuses, and what the pools still count afterwards (per host, and in flight)."""
    async def main() -> tuple[list[int], list[int | None], dict, int]:
        pools = CurlPools(capacity, spread=spread)
        try:
            waiting = [start(pools, f"{server.base_url}/gate") for _ in range(n)]
            await until(lambda: len(server.requests) == n)
            taken = per_pool(pools)
            server.gate.set()
            results = await asyncio.gather(*waiting)
            return taken, [r.status_code if r else None for r in results], \
                dict(pools._in_flight), pools.in_flight
        finally:
            await pools.close()

    return uvloop.run(main())


def test_pool_count_follows_capacity() -> None:
    async def main() -> list[int]:
        counts = []
        for capacity, spread in ((1024, 128), (100, 128), (6, 2), (7, 2)):
            pools = CurlPools(capacity, spread=spread)
            counts.append(len(pools.pools))
            await pools.close()
        return counts

    assert uvloop.run(main()) == [8, 1, 3, 3]


def test_busy_host_fills_one_pool_then_the_next(server: ScriptedServer) -> None:
    spread, statuses, left, in_flight = spread_of_gated(server, 6, 2, 5)
    # Two in the host's own pool, two in the next, the fifth in the last.
    first = hash(host_port(server.base_url)) % 3
    assert spread[first] == 2 and spread[(first + 1) % 3] == 2 and spread[(first + 2) % 3] == 1
    assert statuses == [200] * 5
    assert left == {} and in_flight == 0


def test_every_pool_full_goes_to_the_least_busy(server: ScriptedServer) -> None:
    spread, _, _, _ = spread_of_gated(server, 2, 1, 5)
    assert sorted(spread) == [2, 3]


def test_one_request_at_a_time_keeps_one_connection(server: ScriptedServer) -> None:
    async def main() -> list[int | None]:
        pools = CurlPools(1024)
        try:
            return [(r.status_code if (r := await start(pools, f"{server.base_url}/ok"))
                     else None) for _ in range(20)]
        finally:
            await pools.close()

    assert uvloop.run(main()) == [200] * 20
    # All on the host's own pool, over the connection kept alive from the first.
    assert server.connections == 1


def test_hosts_are_counted_apart(server: ScriptedServer) -> None:
    with scripted_server() as other:
        async def main() -> tuple[list[int], list[int]]:
            pools = CurlPools(4, spread=1)
            try:
                busy = [start(pools, f"{server.base_url}/gate") for _ in range(3)]
                await until(lambda: len(server.requests) == 3)
                before = per_pool(pools)
                quiet = start(pools, f"{other.base_url}/gate")
                await until(lambda: len(other.requests) == 1)
                after = per_pool(pools)
                server.gate.set()
                other.gate.set()
                await asyncio.gather(*busy, quiet)
                return before, after
            finally:
                await pools.close()

        before, after = uvloop.run(main())
    # The second host goes to its own pool whatever the first has in flight there.
    own = hash(host_port(other.base_url)) % 4
    assert sum(before) == 3
    assert after[own] == before[own] + 1
    assert sum(after) == 4


def test_close_answers_what_is_in_flight_with_none(server: ScriptedServer) -> None:
    async def main() -> tuple[list[HttpResult | None], dict, int]:
        pools = CurlPools(4, spread=1)
        waiting = [start(pools, f"{server.base_url}/hang") for _ in range(3)]
        await until(lambda: len(server.requests) == 3)
        await pools.close()
        return await asyncio.gather(*waiting), dict(pools._in_flight), pools.in_flight

    results, left, in_flight = uvloop.run(main())
    assert results == [None, None, None]
    assert left == {} and in_flight == 0

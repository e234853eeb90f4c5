import asyncio
import ipaddress
import time
from collections.abc import Awaitable, Callable, Iterator

import pycurl
import pytest
import uvloop

from engine.webhooks import targets
from engine.worker.http.client import CurlPool, HttpResult
from engine.worker.http.transfer import classify_error
from tests.kit.httpserver_helpers import (
    BIG_BODY,
    PINNED_HOST,
    ScriptedServer,
    assert_loopback,
    assert_system_cannot_resolve,
    closed_port,
    loopback_lookup,
    scripted_server,
)

HEADERS = ["content-type: application/json", "Expect:"]


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with scripted_server() as running:
        yield running


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Callable[[CurlPool], Awaitable]], object]:
    """Run a coroutine taking a fresh CurlPool (made with `pool_args`), on asyncio's loop
    and on uvloop."""

    def runner(body: Callable[[CurlPool], Awaitable], **pool_args: object) -> object:
        async def main() -> object:
            pool = CurlPool(**pool_args)
            try:
                return await body(pool)
            finally:
                await pool.close()

        if request.param == "uvloop":
            return uvloop.run(main())
        return asyncio.run(main())

    return runner


async def post(pool: CurlPool, url: str, timeout_ms: int = 5000, **kwargs: object) -> HttpResult:
    return await pool.post(assert_loopback(url), HEADERS, b'{"n":1}', timeout_ms, **kwargs)


def test_200_body_capped(server: ScriptedServer, run) -> None:
    result = run(lambda pool: post(pool, f"{server.base_url}/big"))
    assert result.status_code == 200
    assert result.error is None and result.ok
    assert result.body == BIG_BODY[:4096]
    assert result.retry_after is None
    assert 0 < result.duration_ms < 5000
    assert abs(result.started_at - time.time()) < 60


def test_request_reaches_server_intact(server: ScriptedServer, run) -> None:
    body = b'{"payload": "\xc3\xa9", "pad": "' + b"p" * 5000 + b'"}'
    headers = ["webhook-id: evt_1", "content-type: application/json", "Expect:"]
    result = run(lambda pool: pool.post(f"{server.base_url}/ok", headers, body, 5000))
    assert result.status_code == 200 and result.body == b"{}"
    [(path, received_headers, received_body)] = server.requests
    assert path == "/ok"
    assert received_body == body
    assert received_headers["webhook-id"] == "evt_1"
    assert "Expect" not in received_headers


def test_body_over_cap_is_drained_keeping_the_connection(server: ScriptedServer, run) -> None:
    async def big_then_small(pool: CurlPool) -> list[HttpResult]:
        return [await post(pool, f"{server.base_url}/{path}") for path in ("big", "ok")]

    big, small = run(big_then_small)
    assert big.ok and big.body == BIG_BODY[:4096]
    assert small.ok
    assert server.connections == 1


def test_body_over_drain_limit_is_aborted_but_answered(server: ScriptedServer) -> None:
    async def main() -> list[HttpResult]:
        pool = CurlPool(max_body=10, max_drain=50_000)
        try:
            return [await post(pool, f"{server.base_url}/{path}") for path in ("big", "ok")]
        finally:
            await pool.close()

    big, small = asyncio.run(main())
    assert big.status_code == 200 and big.error is None
    assert big.body == b"x" * 10
    assert small.ok
    # the aborted transfer took its connection with it
    assert server.connections == 2


def test_500(server: ScriptedServer, run) -> None:
    result = run(lambda pool: post(pool, f"{server.base_url}/status/500"))
    assert result.status_code == 500
    assert result.body == b"status body"
    assert result.error is None and not result.ok


def test_410(server: ScriptedServer, run) -> None:
    assert run(lambda pool: post(pool, f"{server.base_url}/status/410")).status_code == 410


def test_hang_times_out(server: ScriptedServer, run) -> None:
    started = time.monotonic()
    result = run(lambda pool: post(pool, f"{server.base_url}/hang", timeout_ms=300))
    elapsed = time.monotonic() - started
    assert result.error == "timeout"
    assert result.status_code is None and not result.ok
    assert 0.25 <= elapsed < 3.0


def test_connection_refused(run) -> None:
    result = run(lambda pool: post(pool, f"http://127.0.0.1:{closed_port()}/"))
    assert result.error == "connect_refused"
    assert result.status_code is None


def test_redirect_not_followed(server: ScriptedServer, run) -> None:
    result = run(lambda pool: post(pool, f"{server.base_url}/redirect"))
    assert result.status_code == 302
    assert [path for path, _, _ in server.requests] == ["/redirect"]


def test_retry_after_seconds(server: ScriptedServer, run) -> None:
    result = run(lambda pool: post(pool, f"{server.base_url}/retry-after/120"))
    assert result.status_code == 429
    assert result.retry_after == 120.0


def test_retry_after_http_date(server: ScriptedServer, run) -> None:
    result = run(lambda pool: post(pool, f"{server.base_url}/retry-after-date"))
    assert result.status_code == 503
    assert result.retry_after is not None and 100 < result.retry_after <= 121


def test_retry_after_zero_and_huge(server: ScriptedServer, run) -> None:
    async def both(pool: CurlPool) -> list[HttpResult]:
        return [await post(pool, f"{server.base_url}/retry-after/{n}") for n in (0, 10**9)]

    zero, huge = run(both)
    assert zero.status_code == 429 and zero.retry_after is None
    assert huge.retry_after is not None and 0 < huge.retry_after <= 6 * 3600


def test_no_retry_after_on_success(server: ScriptedServer, run) -> None:
    assert run(lambda pool: post(pool, f"{server.base_url}/ok")).retry_after is None


def test_classify_error() -> None:
    assert classify_error(pycurl.E_OPERATION_TIMEDOUT, "x", 0) == "timeout"
    assert classify_error(pycurl.E_COULDNT_RESOLVE_HOST, "x", 0) == "dns"
    assert classify_error(pycurl.E_COULDNT_CONNECT, "x", 111) == "connect_refused"
    assert classify_error(pycurl.E_COULDNT_CONNECT, "x", 113) == "connect"
    assert classify_error(pycurl.E_SSL_CONNECT_ERROR, "x", 0) == "tls"
    assert classify_error(pycurl.E_PEER_FAILED_VERIFICATION, "x", 0) == "tls"
    assert classify_error(pycurl.E_SEND_ERROR, "x", 0) == "send"
    assert classify_error(pycurl.E_RECV_ERROR, "x", 0) == "recv"
    assert classify_error(pycurl.E_URL_MALFORMAT, "bad url", 0) == "curl:3 bad url"


def test_concurrent_slow_requests(server: ScriptedServer, run) -> None:
    """300 requests are open at the server at once: it holds every /gate request until
    all 300 have arrived (serially, the first would never be answered)."""
    requests = 300

    async def burst(pool: CurlPool) -> tuple[list[HttpResult], int]:
        tasks = [asyncio.ensure_future(post(pool, f"{server.base_url}/gate", timeout_ms=30_000))
                 for _ in range(requests)]
        while len(server.requests) < requests and not any(t.done() for t in tasks):
            await asyncio.sleep(0.01)
        peak = pool.in_flight
        server.gate.set()
        return await asyncio.gather(*tasks), peak

    results, peak = run(burst)
    assert all(r.status_code == 200 for r in results), {r.error for r in results}
    assert len(server.requests) == peak == requests


def test_connections_reused(server: ScriptedServer, run) -> None:
    async def sequential(pool: CurlPool) -> list[HttpResult]:
        return [await post(pool, f"{server.base_url}/ok") for _ in range(200)]

    results = run(sequential)
    assert all(r.status_code == 200 for r in results)
    assert len(server.requests) == 200
    assert server.connections <= 3


def test_pin_reaches_server(server: ScriptedServer, run) -> None:
    port = server.server_address[1]
    url = f"http://pinned.invalid:{port}/ok"
    result = run(lambda pool: post(pool, url, pin="127.0.0.1"))
    assert result.status_code == 200, result.error
    [(_, headers, _)] = server.requests
    assert headers["Host"] == f"pinned.invalid:{port}"


LOOPBACK_ONLY = (ipaddress.ip_network("127.0.0.0/8"),)  # allow_targets for loopback


def test_checked_request_connects_to_the_address_its_lookup_checked(
    server: ScriptedServer, run
) -> None:
    """The connect-time check resolves the name (here with a stand-in that knows
    pinned.invalid as 127.0.0.1, which the system resolver does not), checks the address
    against the policy (loopback allowed by an allow-list, so the check runs) and pins it:
    the request arrives, Host header intact, only if curl connects to the pinned address.
    Without the pin curl resolves the name itself, and fails (`dns`). Both the path that
    waits for the lookup and the one from its cached answer."""
    assert_system_cannot_resolve(PINNED_HOST)
    port = server.server_address[1]
    url = f"http://{PINNED_HOST}:{port}/ok"

    async def checked(pool: CurlPool) -> list[HttpResult | None]:
        first = await pool.post_checked(url, HEADERS, b"{}", 5000, LOOPBACK_ONLY)
        done: asyncio.Future[HttpResult | None] = asyncio.get_running_loop().create_future()
        pool.start_checked(url, HEADERS, b"{}", 5000, LOOPBACK_ONLY, done.set_result)
        assert not pool._checking  # the cached answer: started at once, pinned
        return [first, await done]

    results = run(checked, lookup=loopback_lookup)
    assert [(r.status_code, r.error) if r else None for r in results] == [(200, None)] * 2
    assert [headers["Host"] for _, headers, _ in server.requests] == [f"{PINNED_HOST}:{port}"] * 2
    # The premise, through curl: unpinned, the name does not resolve.
    unpinned = run(lambda pool: post(pool, url))
    assert unpinned.error == "dns", unpinned
    assert len(server.requests) == 2


def test_cancelled_post_frees_the_handle(server: ScriptedServer, run) -> None:
    async def cancel_then_post(pool: CurlPool) -> HttpResult:
        hanging = asyncio.ensure_future(post(pool, f"{server.base_url}/hang"))
        await asyncio.sleep(0.1)
        assert pool.in_flight == 1
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging
        assert pool.in_flight == 0
        return await post(pool, f"{server.base_url}/ok")

    assert run(cancel_then_post).status_code == 200


def test_pin_ipv6_address() -> None:
    with scripted_server("::1") as server:
        port = server.server_address[1]

        async def both() -> list[HttpResult]:
            pool = CurlPool()
            try:
                return [
                    await post(pool, f"http://pinned.invalid:{port}/ok", pin="::1"),
                    await post(pool, f"http://[::1]:{port}/ok"),
                ]
            finally:
                await pool.close()

        pinned, literal = asyncio.run(both())
    assert pinned.ok, pinned.error
    assert literal.ok, literal.error
    assert len(server.requests) == 2


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "2130706433"])
def test_post_checked_refuses_private_target(run, host: str) -> None:
    # A server on the address the name means, so that a request let through would arrive.
    with scripted_server("::1" if host == "[::1]" else "127.0.0.1") as server:
        port = server.server_address[1]

        async def checked(pool: CurlPool) -> tuple[HttpResult, int, HttpResult]:
            url = f"http://{host}:{port}/ok"
            refused = await pool.post_checked(url, HEADERS, b"{}", 5000, allow_private=False)
            # Counted before the allowed request: the refused one reached the server or not.
            reached = len(server.requests)
            allowed = await pool.post_checked(url, HEADERS, b"{}", 5000, allow_private=True)
            return refused, reached, allowed

        refused, reached_when_refused, allowed = run(checked)
        assert refused.error == "refused_target" and refused.status_code is None
        assert reached_when_refused == 0, server.requests
        assert allowed.ok, allowed.error
        assert len(server.requests) == 1


def test_timeout_fires_after_an_earlier_deadline_went_away(server: ScriptedServer, run) -> None:
    async def quick_and_hanging(pool: CurlPool) -> tuple[HttpResult, HttpResult, float]:
        started = time.monotonic()
        hanging = asyncio.ensure_future(post(pool, f"{server.base_url}/hang", timeout_ms=600))
        quick = await post(pool, f"{server.base_url}/ok", timeout_ms=200)
        return quick, await hanging, time.monotonic() - started

    quick, hung, elapsed = run(quick_and_hanging)
    assert quick.ok
    assert hung.error == "timeout"
    assert 0.55 <= elapsed < 3.0


def test_start_hands_the_result_to_the_callback_and_close_hands_back_none(
    server: ScriptedServer, run
) -> None:
    async def started(pool: CurlPool) -> tuple[list[HttpResult | None], list[HttpResult | None]]:
        answered: list[HttpResult | None] = []
        hanging: list[HttpResult | None] = []
        pool.start(assert_loopback(f"{server.base_url}/ok"), HEADERS, b"{}", 5000,
                   answered.append)
        pool.start(assert_loopback(f"{server.base_url}/hang"), HEADERS, b"{}", 5000,
                   hanging.append)
        deadline = time.monotonic() + 5
        while not answered and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert hanging == [] and pool.in_flight == 1
        await pool.close()
        return answered, hanging

    answered, hanging = run(started)
    assert len(answered) == 1 and answered[0] is not None and answered[0].ok
    assert hanging == [None]  # unfinished at close: handed back, not left hanging


def test_start_checked_refuses_a_private_target_by_lookup_then_from_the_cache(
    server: ScriptedServer, run
) -> None:
    """A name that resolves to a loopback address (pinned.invalid, from the stand-in
    lookup): the first request waits for the lookup, the second is refused from the cached
    answer; neither is sent."""
    host = PINNED_HOST
    url = f"http://{host}:{server.server_address[1]}/ok"

    key = (host, server.server_address[1], loopback_lookup)
    literal = f"http://127.0.0.1:{server.server_address[1]}/ok"

    async def send(pool: CurlPool, target: str) -> tuple[HttpResult | None, bool]:
        """The result, and whether the request had to wait for a lookup (a pool task)."""
        done: asyncio.Future[HttpResult | None] = asyncio.get_running_loop().create_future()
        pool.start_checked(target, HEADERS, b"{}", 5000, False, done.set_result)
        waits = bool(pool._checking)
        return await done, waits

    async def twice(pool: CurlPool) -> list[tuple[HttpResult | None, bool]]:
        first = await send(pool, url)
        lookup = targets._lookups[key][1]  # the cache entry the first request filled
        assert lookup.done()
        second = await send(pool, url)
        assert targets._lookups[key][1] is lookup  # answered from it: no second lookup
        return [first, second, await send(pool, literal)]

    results = run(twice, lookup=loopback_lookup)
    assert [r.error if r else None for r, _ in results] == ["refused_target"] * 3
    # The first waited for its lookup, the second was refused at once from the cache,
    # the IP literal needed none.
    assert [waited for _, waited in results] == [True, False, False]
    assert server.requests == []

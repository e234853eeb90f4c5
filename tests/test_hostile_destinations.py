"""Hostile destinations, each beside a healthy one, through the HTTP client on both event
loops: every one is a failed attempt with a clear error, the healthy request beside it
succeeds, and no fault of the client's machinery (a libcurl callback raising, a dead multi
handle) escapes. The engine-level soak is in tests/test_hostile_soak.py."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pycurl
import pytest
import uvloop

from engine.worker.http.client import CurlPool, HttpResult
from tests.kit.hostile_servers import HostileServer, TlsServer, _read_request
from tests.kit.httpserver_helpers import closed_port

HEADERS = ["content-type: application/json", "Expect:"]
TIMEOUT_MS = 1500
ROOT = Path(__file__).resolve().parents[1]
# Three requests to a local server are in flight within milliseconds; this is the bound on
# waiting for them, for a failure message instead of a hang.
IN_FLIGHT_WAIT_S = 10.0

# Behaviour -> (expected status code, a predicate on the error text).
EXPECTED: dict[str, tuple[int | None, Callable[[str | None], bool]]] = {
    "reset-headers": (None, lambda e: e == "recv"),
    "reset-body": (200, lambda e: e == "recv"),
    "garbage": (None, lambda e: e == "invalid_response"),
    "http09": (None, lambda e: e == "invalid_response"),
    "drip": (None, lambda e: e == "timeout"),
    "hang": (None, lambda e: e == "timeout"),
    # Answered: the status line counts; the body is drained to a cap, then aborted.
    "huge": (500, lambda e: e is None),
    "redirect": (302, lambda e: e is None),  # not followed
}


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    with HostileServer() as server:
        yield server


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Callable[[CurlPool], Awaitable]], object]:
    def runner(body: Callable[[CurlPool], Awaitable]) -> object:
        async def main() -> object:
            pool = CurlPool()
            try:
                return await body(pool)
            finally:
                await pool.close()

        return uvloop.run(main()) if request.param == "uvloop" else asyncio.run(main())

    return runner


async def beside_healthy(
    pool: CurlPool, hostile: HostileServer, url: str
) -> tuple[HttpResult, list[HttpResult]]:
    """The hostile request, with healthy requests sent one after another while it runs."""
    hostile_task = asyncio.ensure_future(pool.post(url, HEADERS, b'{"n":1}', TIMEOUT_MS))
    healthy = [await pool.post(hostile.url("healthy"), HEADERS, b"{}", TIMEOUT_MS)]
    while not hostile_task.done():
        healthy.append(await pool.post(hostile.url("healthy"), HEADERS, b"{}", TIMEOUT_MS))
    return await hostile_task, healthy


@pytest.mark.parametrize("behaviour", sorted(EXPECTED))
def test_each_hostile_behaviour_is_a_clear_failure_beside_a_healthy_one(
    hostile: HostileServer, run, behaviour: str
) -> None:
    result, healthy = run(lambda pool: beside_healthy(pool, hostile, hostile.url(behaviour)))
    status, error_ok = EXPECTED[behaviour]
    assert result.status_code == status, result
    assert error_ok(result.error), result
    assert not result.ok
    assert all(r.ok for r in healthy), healthy
    assert result.duration_ms < TIMEOUT_MS + 1000  # bounded by the timeout, whatever it sent


def test_refused_connection_and_invalid_certificate(tmp_path: Path, run) -> None:
    with TlsServer(tmp_path) as tls:
        async def body(pool: CurlPool) -> tuple[HttpResult, HttpResult]:
            refused = pool.post(f"http://127.0.0.1:{closed_port()}/", HEADERS, b"{}", TIMEOUT_MS)
            bad_tls = pool.post(tls.url(), HEADERS, b"{}", TIMEOUT_MS)
            return await asyncio.gather(refused, bad_tls)

        refused, bad_tls = run(body)
    assert refused.error == "connect_refused" and refused.status_code is None
    assert bad_tls.error == "tls" and bad_tls.status_code is None
    assert tls.requests["healthy"] == 0  # the certificate was refused before any request


def test_huge_body_is_drained_to_the_cap_not_kept(hostile: HostileServer) -> None:
    """100 MB answered: the pool keeps 4 KiB, stops reading after its drain cap, and the
    process does not grow by anything near the body's size."""
    import psutil

    async def body(pool: CurlPool) -> list[HttpResult]:
        return await asyncio.gather(*(
            pool.post(hostile.url("huge", str(i)), HEADERS, b"{}", 20_000) for i in range(8)))

    before = psutil.Process().memory_info().rss

    async def main() -> list[HttpResult]:
        pool = CurlPool()
        try:
            return await body(pool)
        finally:
            await pool.close()

    results = uvloop.run(main())
    grown = psutil.Process().memory_info().rss - before
    assert all(r.status_code == 500 and len(r.body) == 4096 for r in results), results
    assert grown < 50 * 1024 * 1024, grown  # 8 bodies of 100 MB went by


# A socket watched for reading and writing, then for reading only, closed without a
# POLL_REMOVE while the loop runs, and its number reused by a new socket that libcurl asks
# to watch. When the loop itself watched the sockets (uvloop's add_reader/add_writer),
# libuv re-armed the closed descriptor and abort()ed on the failed epoll_ctl: the workers'
# SIGABRT of issue 37. Run in a child process, so that an abort fails this test with the
# signal's name instead of ending the run.
CLOSED_BEHIND_THE_POOLS_BACK = """
import asyncio, socket, sys
import pycurl, uvloop
from engine.worker.http.client import CurlPool

async def main() -> None:
    pool = CurlPool()
    acted = []
    pool._act = lambda fd, events: acted.append((fd, events))
    first, _ = socket.socketpair()
    fd = first.fileno()
    pool._on_socket(pycurl.POLL_INOUT, fd, pool._multi, None)
    await asyncio.sleep(0.02)
    pool._on_socket(pycurl.POLL_IN, fd, pool._multi, None)
    first.close()
    await asyncio.sleep(0.02)  # the loop runs while the watched number is closed
    second, _ = socket.socketpair()
    assert second.fileno() == fd, (second.fileno(), fd)
    pool._on_socket(pycurl.POLL_OUT, fd, pool._multi, None)
    await asyncio.sleep(0.02)
    pool._on_socket(pycurl.POLL_REMOVE, fd, pool._multi, None)
    print(sorted(set(acted)) == [(fd, pycurl.CSELECT_OUT)], dict(pool.faults.counts))
    await pool.close()

(uvloop.run if sys.argv[1] == "uvloop" else asyncio.run)(main())
"""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_socket_closed_behind_the_pools_back_harms_nothing(loop: str) -> None:
    """The pool's loop watches its epoll, never a socket: a socket closed without a
    POLL_REMOVE leaves that epoll by itself, and the new socket under its number is
    watched as libcurl asks (its readiness reaches libcurl)."""
    result = subprocess.run(
        [sys.executable, "-c", CLOSED_BEHIND_THE_POOLS_BACK, loop], cwd=ROOT,
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, (
        f"exited with {exit_description(result.returncode)}: {result.stderr[-2000:]}")
    # The pool notices that its record and the kernel's disagreed, and says so.
    assert result.stdout.split("\n")[0] == "True {'closed_while_watched': 1}", result.stdout


def exit_description(returncode: int) -> str:
    return (signal.Signals(-returncode).name if returncode < 0
            else f"exit code {returncode}")


def test_an_idle_connection_closed_by_its_peer_leaves_the_pools_epoll(run) -> None:
    """A kept-alive connection stays registered in the pool's epoll after its response
    (idle); when its peer closes it, the registration is dropped as it fires, libcurl is
    not woken, and the next request opens a new connection. No client fault."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/"

        def serve() -> None:  # one request per connection, then the server closes it
            for _ in range(2):
                conn, _ = listener.accept()
                with conn:
                    _read_request(conn, b"")
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    time.sleep(0.2)

        server = threading.Thread(target=serve, daemon=True)
        server.start()

        async def body(pool: CurlPool) -> tuple[HttpResult, bool, HttpResult, dict[str, int]]:
            connecting: list[int] = []  # a connection is watched for writing to connect
            watch = pool._watch

            def recording(what: int, fd: int) -> None:
                if what == pycurl.POLL_OUT:
                    connecting.append(fd)
                watch(what, fd)

            pool._watch = recording  # type: ignore[method-assign]
            first = await pool.post(url, HEADERS, b"{}", TIMEOUT_MS)
            (connection,) = connecting
            idle = connection in pool._idle
            for _ in range(100):  # until the peer's close fires
                if connection not in pool._watched:
                    break
                await asyncio.sleep(0.05)
            assert connection not in pool._idle and connection not in pool._watched
            second = await pool.post(url, HEADERS, b"{}", TIMEOUT_MS)
            return first, idle, second, dict(pool.faults.counts)

        first, idle, second, faults = run(body)
        server.join(5)
    assert first.ok and second.ok, (first, second)
    # Kept idle only when libcurl's last watch of it was for reading alone, which depends
    # on timing (1 run in 3 here asks for both): not asserted, the rest holds either way.
    del idle
    assert faults == {}


def test_dead_multi_handle_is_rebuilt_and_its_transfers_fail_once(
    hostile: HostileServer, run
) -> None:
    """A libcurl callback that raises kills the multi handle (CURLM_ABORTED_BY_CALLBACK):
    the reported `curl_multi_add_handle() failed due to internal errors`. The pool
    replaces it: the requests it held fail once each, as attempts, and new ones work."""

    async def body(pool: CurlPool) -> tuple[list[HttpResult], HttpResult, int]:
        hung = [asyncio.ensure_future(
            pool.post(hostile.url("hang", str(i)), HEADERS, b"{}", 20_000)) for i in range(3)]
        deadline = time.monotonic() + IN_FLIGHT_WAIT_S
        while pool.in_flight < 3:
            assert time.monotonic() < deadline, (
                f"after {IN_FLIGHT_WAIT_S} s the pool holds {pool.in_flight} of the 3 "
                "hanging requests in flight")
            await asyncio.sleep(0.01)

        def raising(*_: object) -> None:
            raise ValueError("a callback that raises into libcurl")

        pool._multi.setopt(pycurl.M_TIMERFUNCTION, raising)  # what any raise did before
        healthy = await pool.post(hostile.url("healthy"), HEADERS, b"{}", 5000)
        return [await h for h in hung], healthy, pool.rebuilds

    hung, healthy, rebuilds = run(body)
    assert rebuilds == 1
    assert healthy.ok
    assert all(r.error is not None and r.error.startswith("internal: http client rebuilt")
               for r in hung), hung


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) to keep DNS on loopback")
def test_unresolvable_name_is_a_dns_failure(tmp_path: Path) -> None:
    """`.invalid` never resolves. The lookup runs in a mount namespace whose resolv.conf
    names a closed loopback port, so no query leaves this machine."""
    script = (
        "import asyncio, sys\n"
        "from engine.worker.http.client import CurlPool\n"
        "async def main():\n"
        "    pool = CurlPool()\n"
        "    r = await pool.post('http://nothing-here.invalid/hook', [], b'{}', 3000)\n"
        "    await pool.close()\n"
        "    print(r.error, r.status_code)\n"
        "asyncio.run(main())\n"
    )
    result = subprocess.run(
        [*isolated_dns_prefix(tmp_path), sys.executable, "-c", script],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["dns", "None"], result.stdout


def isolated_dns_prefix(folder: Path) -> list[str]:
    """A command prefix: run the rest in a private mount namespace whose /etc/resolv.conf
    points at 127.0.0.1:53, where nothing listens (a lookup fails at once, on loopback)."""
    resolv = folder / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv)]


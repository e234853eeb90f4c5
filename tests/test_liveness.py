"""engine/liveness.closed_by_server: tells a connection the server closed from a live one,
without a round trip, whatever its descriptor number."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator

import psycopg
import pytest

from engine.db.liveness import closed_by_server
from tests.kit.enginerun import wait_until


@pytest.fixture(params=["low", "above_fd_setsize"])
def idle(request: pytest.FixtureRequest, dsn: str) -> Iterator[psycopg.Connection]:
    """An idle connection; in the second case its descriptor is above 1024, as in a worker
    with hundreds of HTTP connections open."""
    fillers: list[int] = []
    if request.param == "above_fd_setsize":
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 1100:
            # Any process may raise its soft limit up to the hard one, as a worker does.
            if hard != resource.RLIM_INFINITY and hard < 1100:
                pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}")
            resource.setrlimit(resource.RLIMIT_NOFILE, (1100, hard))
            request.addfinalizer(
                lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
        fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1050)]
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            if fillers:
                assert conn.pgconn.socket > 1024
            yield conn
    finally:
        for fd in fillers:
            os.close(fd)


def test_a_live_idle_connection_is_usable(idle: psycopg.Connection) -> None:
    idle.execute("SELECT 1")
    assert not closed_by_server(idle)


def test_a_connection_the_server_ended_is_seen_before_use(
    idle: psycopg.Connection, conn: psycopg.Connection
) -> None:
    conn.execute("SELECT pg_terminate_backend(%s)", [idle.info.backend_pid])
    wait_until(lambda: closed_by_server(idle), 10, "the goodbye to arrive")
    with pytest.raises(psycopg.OperationalError):
        idle.execute("SELECT 1")


def test_a_closed_connection_is_not_usable(idle: psycopg.Connection) -> None:
    idle.close()
    assert closed_by_server(idle)

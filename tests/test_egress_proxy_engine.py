"""The egress proxy through a running engine (SPEC, "Egress"): with --egress-proxy, two
worker processes send every delivery through a real forward proxy (proxy.py, which logs
each CONNECT); a destination at an address the target policy refuses is refused before
the proxy sees anything; a dead proxy is the `proxy` attempt error, retried as any other.
The proxy with mutual TLS and OAuth2 through the engine: tests/test_egress_engine.py."""

from __future__ import annotations

from pathlib import Path

import psycopg

from tests.kit.data import add_destination, enqueue, finished
from tests.kit.egress_servers import receiver
from tests.kit.enginerun import Engine, wait_until
from tests.kit.forward_proxy import ForwardProxy
from tests.kit.httpserver_helpers import closed_port

BATCHES = 3
BATCH = 15  # sent at once: up to BATCH connections in each of the two workers
EVENTS = BATCHES * BATCH


def attempt_errors(conn: psycopg.Connection, destination: int) -> list[str | None]:
    return [row[0] for row in conn.execute(
        "SELECT error FROM delivery_attempts WHERE destination_id = %s ORDER BY id",
        [destination]).fetchall()]


def test_deliveries_through_the_operators_proxy(dsn: str, tmp_path: Path) -> None:
    config = tmp_path / "engine.toml"
    config.write_text('breaker_threshold = 1000\nretry_schedule = "1s,1s,1s,1s,1s,1s,1s,1s"\n')
    with (ForwardProxy(tmp_path) as proxy, receiver() as dest,
          psycopg.connect(dsn, autocommit=True) as conn):
        through = add_destination(conn, url=dest.url())
        # 127.0.0.2 is loopback too, but only 127.0.0.1 is an allowed target.
        refused = add_destination(conn, url=f"http://127.0.0.2:{dest.port}/hook")
        # Its own proxy, at an address nothing listens on.
        dead = f"http://127.0.0.1:{closed_port()}"
        dead_proxied = add_destination(
            conn, url=dest.url("/dead"), proxy=dead,
            egress_revision=conn.execute("SELECT nextval('egress_revision_seq')").fetchone()[0])
        with Engine(dsn, tmp_path, "--config", str(config), "--allow-targets", "127.0.0.1/32",
                    "--bind", "127.0.0.1:0", "--procs", "2", "--egress-proxy", proxy.url):
            enqueue(conn, ['{"n":"refused"}'], [refused])
            enqueue(conn, ['{"n":"dead"}'], [dead_proxied])
            for batch in range(1, BATCHES + 1):
                enqueue(conn, [f'{{"n":{n}}}' for n in range(BATCH)], [through])
                wait_until(lambda sent=batch * BATCH: finished(conn, through) == sent, 60,
                           f"batch {batch} delivered")
            wait_until(lambda: len(attempt_errors(conn, refused)) >= 1, 30,
                       "the refused destination's attempt")
            wait_until(lambda: attempt_errors(conn, dead_proxied).count("proxy") >= 2, 30,
                       "two attempts through the dead proxy")

            # Every delivery went through the proxy, over tunnels kept alive: the later
            # batches reuse the first's (at most one batch's worth per worker).
            tunnels = proxy.requests()
            assert set(tunnels) == {f"CONNECT 127.0.0.1:{dest.port}"}, tunnels
            assert dest.connections == len(tunnels) <= 2 * BATCH, (dest.connections,
                                                                   len(tunnels))
            assert dest.requests == EVENTS
            assert set(attempt_errors(conn, through)) == {None}

            # The refused destination: refused here, never asked of the proxy.
            assert set(attempt_errors(conn, refused)) == {"refused_target"}

            # The dead proxy: `proxy` attempts, retried; once the destination's proxy is
            # removed, the next retry goes through the operator's and is delivered.
            assert set(attempt_errors(conn, dead_proxied)) == {"proxy"}
            conn.execute("UPDATE destinations SET proxy = NULL, egress_revision = NULL"
                         " WHERE id = %s", [dead_proxied])
            wait_until(lambda: finished(conn, dead_proxied) == 1, 30,
                       "the dead proxy's delivery, retried")
            assert attempt_errors(conn, dead_proxied)[-1] is None
        assert f"CONNECT 127.0.0.1:{dest.port}" in proxy.requests()
        assert not any("127.0.0.2" in line for line in proxy.requests())

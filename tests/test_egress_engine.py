"""Egress end to end through a running engine (SPEC, "Egress"): two worker processes send
to a receiver behind mutual TLS with a private CA that also demands an OAuth2 bearer
token, directly and through --egress-proxy (proxy.py: the TLS tunnels and the token
fetches both go through it; more on the proxy: tests/test_egress_proxy_engine.py). Tokens live 2 s:
they are kept in the database and shared by both processes, fetched one at a time, refreshed shortly
before they expire, and a token the receiver refuses (401) is refreshed once within the
attempt. A failing token endpoint is an `oauth` attempt error."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import psycopg
import pytest
import trustme
from psycopg.types.json import Jsonb

from tests.kit import queue_sync
from tests.kit.data import add_destination, enqueue, finished
from tests.kit.egress_servers import receiver, server_context, token_endpoint
from tests.kit.enginerun import Engine, wait_until
from tests.kit.forward_proxy import ForwardProxy

EVENTS = 60
SPREAD_S = 5.0
TOKEN_LIFETIME_S = 2.0


@pytest.mark.parametrize("through_proxy", [False, True], ids=["direct", "proxy"])
def test_mtls_oauth_and_proxy_through_the_engine(dsn: str, tmp_path: Path, config: Path,
                                                 through_proxy: bool) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("engine-client.example")
    with (ForwardProxy(tmp_path) if through_proxy else nullcontext() as proxy,
          token_endpoint("engine", "s3cr3t", TOKEN_LIFETIME_S) as tokens,
          receiver(server_context(ca, require_client_cert=True), tokens=tokens) as dest,
          psycopg.connect(dsn, autocommit=True) as conn):
        destination = add_destination(
            conn, url=dest.url(), tls_client_cert=leaf.cert_chain_pems[0].bytes().decode(),
            tls_client_key=leaf.private_key_pem.bytes().decode(),
            tls_ca_bundle=ca.cert_pem.bytes().decode(),
            auth=Jsonb({"type": "oauth2_client_credentials", "token_url": tokens.url,
                        "client_id": "engine", "client_secret": "s3cr3t",
                        "scope": "hooks"}),
            egress_revision=1)
        proxy_args = ["--egress-proxy", proxy.url] if proxy is not None else []
        with Engine(dsn, tmp_path, "--config", str(config), "--allow-private-targets",
                    "--bind", "127.0.0.1:0", "--procs", "2", *proxy_args) as engine:
            began = time.monotonic()
            # The first token lives long, so the one in use when it is revoked is
            # certainly still held (not about to be refreshed); those after it live
            # TOKEN_LIFETIME_S and are refreshed ahead of their expiry.
            tokens.expires_in = 60.0
            for n in range(EVENTS):
                enqueue(conn, [f'{{"n":{n}}}'], [destination])
                # Woken as by ingress: sent as they come, not together at the next poll.
                queue_sync.notify_deliveries(conn)
                if n == 0:
                    # The rest is spread over steady sending, not piled up behind the first
                    # token fetch and sent at once, each on a connection of its own.
                    wait_until(lambda: finished(conn, destination) >= 1, 60,
                               "a delivery with the first token")
                if n == EVENTS // 2:
                    tokens.expires_in = TOKEN_LIFETIME_S
                    tokens.revoke_all()  # the receiver now refuses the token in use
                time.sleep(SPREAD_S / EVENTS)
            try:
                wait_until(lambda: finished(conn, destination) == EVENTS, 60, "all delivered")
            except AssertionError:
                raise AssertionError(conn.execute(
                    "SELECT error, status_code, count(*) FROM delivery_attempts"
                    " GROUP BY 1, 2").fetchall()) from None
            took_s = time.monotonic() - began
            engine.assert_no_callback_raised()

            # Every attempt succeeded: the refused token was refreshed within its attempt.
            attempts = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE status_code = 200)"
                " FROM delivery_attempts").fetchone()
            assert attempts == (EVENTS, EVENTS), attempts
            assert dest.rejected >= 1  # the 401 after the revocation
            # Shared and reused: about one token per 1.8 s of the run (its lifetime less a
            # tenth), plus the one after the revocation, not one per delivery or process.
            assert tokens.most_concurrent == 1
            assert 2 <= tokens.calls <= took_s / (TOKEN_LIFETIME_S * 0.9) + 3, (
                tokens.calls, took_s)
            assert set(tokens.scopes) == {"hooks"}
            assert conn.execute("SELECT count(*) FROM oauth_tokens").fetchone()[0] == 1
            assert dest.connections < EVENTS // 4, dest.connections  # kept alive (2 workers)
            if proxy is not None:  # every connection and token fetch was a tunnel
                tunnels = proxy.requests()
                assert tunnels.count(f"CONNECT 127.0.0.1:{dest.port}") == dest.connections
                token_port = tokens.url.split(":")[2].split("/")[0]
                assert 1 <= tunnels.count(f"CONNECT 127.0.0.1:{token_port}") <= tokens.calls

            # A failing token endpoint: attempts fail as `oauth`.
            tokens.failing = True
            tokens.revoke_all()
            conn.execute("UPDATE oauth_tokens SET refresh_at = now()")
            enqueue(conn, ['{"n":"last"}'], [destination])
            wait_until(lambda: conn.execute(
                "SELECT count(*) FROM delivery_attempts WHERE error = 'oauth'").fetchone()[0],
                30, "an oauth attempt error")
        log = engine.log_path.read_text()
        assert "s3cr3t" not in log and "PRIVATE KEY" not in log

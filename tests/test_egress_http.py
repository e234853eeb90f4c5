"""The worker's HTTP client with egress options, against real servers on 127.0.0.1 (SPEC,
"Egress"): a receiver that demands a client certificate from a private CA, --ca-bundle,
and a real forward proxy (proxy.py) that logs what it passes upstream. Every request
through the proxy is a tunnel to the address the target check pinned; a refused
destination is refused before the proxy sees anything."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from engine.webhooks.egress import EgressOptions
from engine.webhooks.targets import Allowance
from engine.worker.http.client import CurlPool, HttpResult
from tests.kit.egress_servers import Receiver, receiver, server_context
from tests.kit.forward_proxy import ForwardProxy
from tests.kit.httpserver_helpers import (
    PINNED_HOST,
    assert_system_cannot_resolve,
    closed_port,
    loopback_lookup,
)

HEADERS = ["content-type: application/json", "Expect:"]
LOOPBACK: Allowance = (__import__("ipaddress").ip_network("127.0.0.0/8"),)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def mtls(ca: trustme.CA) -> Iterator[Receiver]:
    with receiver(server_context(ca, require_client_cert=True)) as server:
        yield server


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ForwardProxy]:
    with ForwardProxy(tmp_path) as running:
        yield running


def client_options(ca: trustme.CA, **more: object) -> EgressOptions:
    leaf = ca.issue_cert("engine-client.example")
    return EgressOptions(client_cert=leaf.cert_chain_pems[0].bytes(),
                         client_key=leaf.private_key_pem.bytes(),
                         ca_bundle=ca.cert_pem.bytes(), **more)  # type: ignore[arg-type]


def posts(url: str, n: int, allowance: Allowance = LOOPBACK,
          egress: EgressOptions | None = None, **pool_args: object) -> list[HttpResult]:
    """`n` POSTs one after another through one pool (checked, as the worker sends)."""

    async def main() -> list[HttpResult]:
        pool = CurlPool(lookup=loopback_lookup, **pool_args)  # type: ignore[arg-type]
        try:
            return [await pool.post_checked(url, HEADERS, b'{"n":1}', 5000, allowance, egress)
                    for _ in range(n)]
        finally:
            await pool.close()

    return asyncio.run(main())


def test_mutual_tls_with_a_private_ca_and_kept_alive(ca: trustme.CA, mtls: Receiver) -> None:
    results = posts(mtls.url(), 20, egress=client_options(ca))
    assert [r.status_code for r in results] == [200] * 20, results[0]
    assert mtls.requests == 20
    assert mtls.connections == 1  # one handshake: the connection is reused
    assert len(mtls.client_subjects) == 20  # each request came with the certificate


def test_without_the_client_certificate_the_handshake_fails(
    ca: trustme.CA, mtls: Receiver
) -> None:
    (result,) = posts(mtls.url(), 1, egress=EgressOptions(ca_bundle=ca.cert_pem.bytes()))
    assert result.status_code is None and result.error in ("tls", "recv", "send")
    (untrusted,) = posts(mtls.url(), 1)  # the system's CAs do not know the private CA
    assert untrusted.error == "tls"
    assert mtls.requests == 0


def test_ca_bundle_for_all(ca: trustme.CA) -> None:
    with receiver(server_context(ca, require_client_cert=False)) as server:
        (result,) = posts(server.url(), 1, ca_bundle=ca.cert_pem.bytes())
        assert result.status_code == 200, result
        (other,) = posts(server.url(), 1, ca_bundle=trustme.CA().cert_pem.bytes())
        assert other.error == "tls"


def test_through_the_proxy_to_the_checked_address(
    ca: trustme.CA, mtls: Receiver, proxy: ForwardProxy
) -> None:
    assert_system_cannot_resolve(PINNED_HOST)
    with receiver() as plain:
        # A name: resolved and checked here, and the proxy is asked for the address.
        url = f"http://{PINNED_HOST}:{plain.port}/hook"
        results = posts(url, 3, egress=EgressOptions(proxy=proxy.url, proxy_trusted=True))
        assert [r.status_code for r in results] == [200] * 3, results[0]
        assert plain.connections == 1  # one tunnel, kept alive
    # HTTPS with a client certificate, tunnelled.
    tls = posts(mtls.url(), 2, egress=client_options(ca, proxy=proxy.url, proxy_trusted=True))
    assert [r.status_code for r in tls] == [200, 200], tls[0]
    assert proxy.requests() == [f"CONNECT 127.0.0.1:{plain.port}",
                                f"CONNECT 127.0.0.1:{mtls.port}"]


def test_a_refused_destination_never_reaches_the_proxy(proxy: ForwardProxy) -> None:
    with receiver() as plain:
        through = EgressOptions(proxy=proxy.url, proxy_trusted=True)
        # The proxy is allowed by its configuration; the destination is not allowed.
        for url in (plain.url(), f"http://{PINNED_HOST}:{plain.port}/hook"):
            (result,) = posts(url, 1, allowance=False, egress=through)
            assert result.error == "refused_target", result
        assert proxy.requests() == [] and plain.connections == 0


def test_a_destination_proxy_is_checked_like_a_target(proxy: ForwardProxy) -> None:
    """Not the operator's: a proxy at a refused address is not connected to."""
    with receiver() as plain:
        own = EgressOptions(proxy=proxy.url)
        (refused,) = posts(f"http://{PINNED_HOST}:{plain.port}/hook", 1,
                           allowance=(__import__("ipaddress").ip_network("10.0.0.0/8"),),
                           egress=own)
        assert refused.error in ("refused_target", "proxy")
        assert proxy.requests() == []
        (allowed,) = posts(plain.url(), 1, egress=own)
        assert allowed.status_code == 200


def test_a_dead_proxy_is_a_proxy_error() -> None:
    dead = EgressOptions(proxy=f"http://127.0.0.1:{closed_port()}", proxy_trusted=True)
    (result,) = posts("http://127.0.0.1:9/hook", 1, egress=dead)
    assert result.error == "proxy" and result.status_code is None

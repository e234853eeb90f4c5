"""Security properties, as tests: secrets and tokens stay out of logs and error messages,
the token check is constant-time, SSRF targets are refused before any connect, each
destination's deliveries carry only its own signature, and header values with CR/LF
never get in.

Covered elsewhere and not repeated here: redirects are never followed
(tests/test_http_client.py::test_redirect_not_followed), numeric and IPv4-mapped forms of
private addresses (tests/test_targets.py).
"""

from __future__ import annotations

import ast
import inspect
import socket
import textwrap
import threading
from pathlib import Path

import psycopg
import pytest

from engine.ingress.keys import KeyRing
from engine.testing.fakedest import FakeDestination
from engine.testing.ingress_server import IngressProcess
from engine.webhooks.signing import generate_secret
from tests.kit.enginerun import Engine, wait_until

TOKEN = "tok_" + "S3cr3tT0ken" * 3


def test_token_check_is_constant_time() -> None:
    """The bearer token is compared with hmac.compare_digest, and with nothing else."""
    source = textwrap.dedent(inspect.getsource(KeyRing.caller))
    tree = ast.parse(source)
    calls = [ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert "hmac.compare_digest" in calls
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
            isinstance(op, ast.Eq | ast.NotEq) for op in node.ops
        ):
            compared = ast.unparse(node)
            assert "token" not in compared and "given" not in compared, compared


@pytest.mark.parametrize("given", [None, "", "Bearer", "Bearer x", f"Bearer {TOKEN[:-1]}",
                                   f"Bearer {TOKEN}x", f"Basic {TOKEN}", TOKEN])
def test_wrong_tokens_are_401_without_echoing_anything(
    dsn: str, conn: psycopg.Connection, given: str | None
) -> None:
    with IngressProcess(dsn, token=TOKEN) as server:
        headers = {} if given is None else {"Authorization": given}
        answer = server.request("POST", "/v1/events", {"type": "t", "payload": 1},
                                headers=headers, auth=False)
        assert answer.status == 401
        assert TOKEN[:8].encode() not in answer.body
        assert server.request("GET", "/v1/destinations").status == 200
    assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)


def test_error_messages_never_echo_secrets_or_credentials(dsn: str) -> None:
    marker = "Pa55wordMarker"
    with IngressProcess(dsn, token=TOKEN) as server:
        answers = [
            server.request("POST", "/v1/destinations",
                           {"url": "http://127.0.0.1:9/", "secret": f"whsec_{marker}!!"}),
            server.request("POST", "/v1/destinations",
                           {"url": "http://127.0.0.1:9/", "secret": f"{marker}"}),
            server.request("POST", "/v1/destinations",
                           {"url": f"http://user:{marker}@127.0.0.1:9/"}),
            server.request("POST", "/v1/destinations", {"url": 1, "secret": marker}),
        ]
    for answer in answers:
        assert answer.status == 422, answer
        assert marker.encode() not in answer.body, answer


def _listener() -> tuple[socket.socket, list[int]]:
    """A loopback socket that records the peer port of every connection made to it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    accepted: list[int] = []

    def accept() -> None:
        while True:
            try:
                peer, address = sock.accept()
            except OSError:
                return
            accepted.append(address[1])
            peer.close()

    threading.Thread(target=accept, daemon=True).start()
    return sock, accepted


def _connections_so_far(sock: socket.socket, accepted: list[int]) -> list[int]:
    """Every connection made to `sock` until now, besides this one: a connection of our
    own is accepted after every earlier one still in the listen backlog (accept is in
    arrival order), so once it shows up nothing made before it can still be missing."""
    with socket.create_connection(sock.getsockname(), timeout=5) as own:
        own_port = own.getsockname()[1]
        wait_until(lambda: own_port in accepted, 10, "our own connection to be accepted")
    return [port for port in accepted if port != own_port]


def test_private_targets_are_refused_before_any_connect(
    dsn: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    """Refused by the API at creation; and a loopback destination already in the database
    (made while --allow-private-targets was on, say) is refused by the worker at connect
    time: a failed attempt saying so, and not one TCP connection."""
    sock, accepted = _listener()
    port = sock.getsockname()[1]
    with Engine(dsn, tmp_path, "--procs", "1", "--bind", "127.0.0.1:0") as engine:
        [started] = wait_until(lambda: engine.events("supervisor_started"), 30, "supervisor")
        client = IngressProcess(dsn)
        client.port = int(started["bind"].rsplit(":", 1)[1])
        wait_until(lambda: _status(client, "/healthz") == 200, 30, "ingress")
        for host in ("127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "2130706433", "127.1",
                     "10.0.0.1", "169.254.169.254", "0.0.0.0"):
            refused = client.request("POST", "/v1/destinations",
                                     {"url": f"http://{host}:{port}/hook"})
            assert refused.status == 422, (host, refused)
        [(destination,)] = conn.execute(
            "INSERT INTO destinations (url, secret) VALUES (%s, %s) RETURNING id",
            [f"http://127.0.0.1:{port}/hook", generate_secret()],
        ).fetchall()
        sent = client.request("POST", "/v1/events",
                              {"type": "t", "payload": 1, "destination_ids": [destination]})
        assert sent.status == 202, sent
        row = wait_until(lambda: conn.execute(
            "SELECT error FROM delivery_attempts").fetchone(), 30, "the attempt")
        # Read while the listener still accepts, not after it closed: a connection
        # still in its backlog then would never be counted.
        connections = _connections_so_far(sock, accepted)
    sock.close()
    assert connections == [], f"the worker connected to a refused target: {connections}"
    assert row[0] == "refused_target", row


def _status(client: IngressProcess, path: str) -> int:
    try:
        return client.request("GET", path, timeout=5).status
    except OSError:
        return 0


def test_each_destination_is_signed_with_its_own_secret_and_no_secret_is_logged(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = {"a": generate_secret(), "b": generate_secret()}
    monkeypatch.setenv("ENGINE_API_TOKEN", TOKEN)
    with FakeDestination() as fake, Engine(
        dsn, tmp_path, "--procs", "2", "--bind", "127.0.0.1:0", "--allow-private-targets",
    ) as engine:
        for name, secret in secrets.items():
            fake.set_secrets(name, [secret])  # each name checks only its own secret
        [started] = wait_until(lambda: engine.events("supervisor_started"), 30, "supervisor")
        client = IngressProcess(dsn, token=TOKEN)
        client.port = int(started["bind"].rsplit(":", 1)[1])
        wait_until(lambda: _status(client, "/healthz") == 200, 30, "ingress")
        for name, secret in secrets.items():
            created = client.request("POST", "/v1/destinations",
                                     {"url": fake.url(f"fast/{name}"), "secret": secret})
            assert created.status == 201, created
        for n in range(20):  # fanned out to both: one payload, two signatures
            assert client.request("POST", "/v1/events", {"type": "t", "payload": n}).status == 202
        # Requests that fail, so that error paths get their chance to log something.
        client.request("POST", "/v1/events", {"type": "t"}, headers={
            "Authorization": f"Bearer {secrets['a']}"}, auth=False)
        client.request("POST", "/v1/destinations", {"url": "ftp://x", "secret": secrets["b"]})
        for name in secrets:
            stats = fake.wait_for(name, "delivered_ids", 20, timeout=60)
            assert stats["sig_bad"] == 0, (name, stats)
            assert stats["sig_ok"] >= 20, (name, stats)
        log = engine.log_path.read_text()
    for secret in secrets.values():
        assert secret not in log
        assert secret.removeprefix("whsec_") not in log
    assert TOKEN not in log


@pytest.mark.parametrize("value", [b"a\rb", b"a\nb", b"a\rX-Injected: 1"])
def test_header_values_with_cr_or_lf_are_refused(
    dsn: str, conn: psycopg.Connection, value: bytes
) -> None:
    """HTTP clients refuse to send such values; a raw socket can. The server must not read
    a second header (or request) out of one value, and writes nothing. (Per-destination
    outgoing `headers` are #18's; their CR/LF refusal is tested with them.)"""
    with IngressProcess(dsn) as server:
        body = b'{"type": "t", "payload": 1}'
        request = (
            b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Idempotency-Key: " + value + b"\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            raw.sendall(request)
            raw.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := raw.recv(65536):
                answer += chunk
        # httptools answers 400, or for a bare CR just closes the connection.
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)

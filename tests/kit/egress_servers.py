"""Real servers on 127.0.0.1 for the egress tests: an HTTP(S) receiver that can demand a
client certificate signed by a private CA and a bearer token, and an OAuth2 token endpoint
that counts its calls and issues tokens that expire quickly. Certificates are made per
run with trustme; the forward proxy is proxy.py (tests/kit/forward_proxy.py)."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socket import socket
from urllib.parse import parse_qs

import trustme


class Receiver(ThreadingHTTPServer):
    """Counts connections (TLS handshakes, when TLS) and requests; with `tokens`, a
    request must carry `Authorization: Bearer <a live token of that endpoint>`, else 401."""

    daemon_threads = True
    request_queue_size = 128  # listen backlog: a burst of new connections is not dropped

    def __init__(self, context: ssl.SSLContext | None, tokens: TokenEndpoint | None) -> None:
        super().__init__(("127.0.0.1", 0), ReceiverHandler)
        self.context = context
        self.tokens = tokens
        self.lock = threading.Lock()
        self.connections = 0
        self.requests = 0
        self.rejected = 0
        self.client_subjects: list[str] = []

    @property
    def port(self) -> int:
        return self.server_address[1]

    def url(self, path: str = "/hook") -> str:
        scheme = "https" if self.context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def get_request(self) -> tuple[socket, object]:
        sock, address = super().get_request()
        with self.lock:
            self.connections += 1
        if self.context is None:
            return sock, address
        sock.settimeout(10)
        # The handshake runs in the connection's own thread (finish_request), never in
        # the accept loop: a client whose ClientHello comes late (through a proxy that is
        # busy connecting to this very server) must not stop every other accept.
        return (self.context.wrap_socket(sock, server_side=True,
                                         do_handshake_on_connect=False), address)

    def finish_request(self, request: socket, client_address: object) -> None:  # type: ignore[override]
        if isinstance(request, ssl.SSLSocket):
            try:
                request.do_handshake()
            except (ssl.SSLError, OSError):
                return  # a failed handshake: the connection is closed, nothing served
        super().finish_request(request, client_address)


class ReceiverHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Receiver

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        server = self.server
        status = 200
        if server.tokens is not None:
            auth = self.headers.get("Authorization", "")
            if not (auth.startswith("Bearer ") and server.tokens.live(auth[7:])):
                status = 401
        with server.lock:
            server.requests += 1
            server.rejected += status == 401
            if isinstance(self.connection, ssl.SSLSocket):
                peer = self.connection.getpeercert()
                if peer:
                    server.client_subjects.append(str(peer.get("subject")))
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def server_context(ca: trustme.CA, require_client_cert: bool) -> ssl.SSLContext:
    """The receiver's TLS: a certificate for 127.0.0.1 from `ca`; with
    `require_client_cert`, the handshake fails without a client certificate from `ca`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        ca.configure_trust(context)
    return context


@contextmanager
def receiver(context: ssl.SSLContext | None = None,
             tokens: TokenEndpoint | None = None) -> Iterator[Receiver]:
    server = Receiver(context, tokens)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class TokenEndpoint(ThreadingHTTPServer):
    """OAuth2 client credentials (RFC 6749 4.4): checks the client's HTTP Basic
    credentials, counts calls, issues `tok-N` living `expires_in` seconds. `failing`:
    answer 500 instead. `delay_s`: wait that long before answering (to overlap callers)."""

    daemon_threads = True

    def __init__(self, client_id: str, client_secret: str, expires_in: float) -> None:
        super().__init__(("127.0.0.1", 0), TokenHandler)
        self.client_id = client_id
        self.client_secret = client_secret
        self.expires_in = expires_in
        self.failing = False
        self.delay_s = 0.0
        self.lock = threading.Lock()
        self.calls = 0
        self.concurrent = 0
        self.most_concurrent = 0
        self.scopes: list[str | None] = []
        self.issued: dict[str, float] = {}  # token -> expiry (monotonic)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/oauth/token"

    def live(self, token: str) -> bool:
        with self.lock:
            expiry = self.issued.get(token)
        return expiry is not None and time.monotonic() < expiry

    def revoke_all(self) -> None:
        with self.lock:
            self.issued.clear()


class TokenHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: TokenEndpoint

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        server = self.server
        form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode())
        with server.lock:
            server.calls += 1
            server.concurrent += 1
            server.most_concurrent = max(server.most_concurrent, server.concurrent)
        try:
            time.sleep(server.delay_s)
            expected = base64.b64encode(
                f"{server.client_id}:{server.client_secret}".encode()).decode()
            if server.failing:
                self._answer(500, {"error": "server_error"})
            elif (self.headers.get("Authorization") != f"Basic {expected}"
                  or form.get("grant_type") != ["client_credentials"]):
                self._answer(401, {"error": "invalid_client"})
            else:
                with server.lock:
                    token = f"tok-{server.calls}"
                    server.issued[token] = time.monotonic() + server.expires_in
                    server.scopes.append(form.get("scope", [None])[0])
                self._answer(200, {"access_token": token, "token_type": "Bearer",
                                   "expires_in": server.expires_in})
        finally:
            with server.lock:
                server.concurrent -= 1

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def token_endpoint(client_id: str, client_secret: str,
                   expires_in: float = 2.0) -> Iterator[TokenEndpoint]:
    server = TokenEndpoint(client_id, client_secret, expires_in)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()

"""A loopback HTTP server with scripted behaviours, for HTTP client tests."""

import email.utils
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from engine.webhooks.targets import TargetUnresolvable

BIG_BODY = b"x" * 100_000


def assert_loopback(url: str) -> str:
    """Tests talk to this machine only; refuse any other target before connecting."""
    host = urlsplit(url).hostname or ""
    if host != "pinned.invalid" and not ipaddress.ip_address(host).is_loopback:
        raise AssertionError(f"test URL {url!r} is not on loopback")
    return url


# A name that only the engine's resolution step knows: `.invalid` never resolves (RFC 6761),
# so a request to it reaches a server only at the address the engine checked and pinned.
PINNED_HOST = "pinned.invalid"


async def loopback_lookup(host: str, port: int) -> list[str]:
    """A stand-in for the system resolver (engine.webhooks.targets.Lookup): PINNED_HOST is
    127.0.0.1, every other name does not resolve."""
    if host == PINNED_HOST:
        return ["127.0.0.1"]
    raise TargetUnresolvable(f"host {host!r} does not resolve (loopback_lookup)")


def assert_system_cannot_resolve(host: str) -> None:
    """The premise of a pinning test: the system resolver has no answer for `host` (one in
    /etc/hosts, say, would let a request arrive without the pin)."""
    try:
        answer = socket.getaddrinfo(host, 80)
    except socket.gaierror:
        return
    raise AssertionError(f"the system resolves {host!r} ({answer}): the test needs it not to")


def closed_port() -> int:
    """A 127.0.0.1 port with nothing listening (refuses connections)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ScriptedServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # hundreds of concurrent connects must not hit SYN drops

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, 0), ScriptedHandler)
        self.connections = 0
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.gate = threading.Event()  # /gate requests are answered once it is set

    def process_request(self, request: socket.socket, client_address: tuple) -> None:
        with self.lock:
            self.connections += 1
        super().process_request(request, client_address)

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # headers and body go out in two writes
    server: ScriptedServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        with self.server.lock:
            self.server.requests.append((self.path, dict(self.headers.items()), body))
        path = self.path
        if path == "/big":
            self.reply(200, BIG_BODY)
        elif path.startswith("/status/"):
            self.reply(int(path.rsplit("/", 1)[1]), b"status body")
        elif path == "/redirect":
            self.reply(302, b"", [("Location", f"{self.server.base_url}/ok")])
        elif path.startswith("/retry-after/"):
            self.reply(429, b"", [("Retry-After", path.rsplit("/", 1)[1])])
        elif path == "/retry-after-date":
            when = email.utils.formatdate(time.time() + 120, usegmt=True)
            self.reply(503, b"", [("retry-after", when)])
        elif path == "/hang":
            self.server.stopping.wait(30)
        elif path == "/gate":
            if self.server.gate.wait(30):
                self.reply(200, b"{}")
        elif path == "/slow":
            time.sleep(0.2)
            self.reply(200, b"{}")
        else:
            self.reply(200, b"{}")

    def reply(self, status: int, body: bytes, headers: list[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def scripted_server(host: str = "127.0.0.1") -> Iterator[ScriptedServer]:
    server = ScriptedServer(host)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join()

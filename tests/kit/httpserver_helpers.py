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

BIG_BODY = b"x" * 100_000


def assert_loopback(url: str) -> str:
    """Tests talk to this machine only; refuse any other target before connecting."""
    host = urlsplit(url).hostname or ""
    if host != "pinned.invalid" and not ipaddress.ip_address(host).is_loopback:
        raise AssertionError(f"test URL {url!r} is not on loopback")
    return url


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

"""Loopback destinations that misbehave on purpose, for the hostile-destination tests.

One raw TCP server (no HTTP library: most behaviours are not HTTP) answers by the first
path segment of the request:

  /healthy/...        200, keep-alive; counts each `webhook-id` it receives
  /healthy-slow/...   the same after 0.5 s
  /reset-headers/...  half a status line, then a TCP reset
  /reset-body/...     headers promising 1000 bytes, 100 of them, then a TCP reset
  /garbage/...        a line that is no status line, then close
  /http09/...         a body with no status line at all (HTTP/0.9), then close
  /drip/...           a valid response, one byte per second
  /huge/...           500 with a 100 MB body, streamed as fast as the client reads
  /redirect/...       302 to itself
  /hang/...           reads the request, never answers

`TlsServer` is the `healthy` behaviour behind a self-signed certificate.
"""

from __future__ import annotations

import socket
import socketserver
import ssl
import struct
import subprocess
import threading
from collections import Counter
from pathlib import Path

HUGE_BODY_BYTES = 100 * 1024 * 1024


def _read_request(sock: socket.socket, pending: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(request line, header block, rest) of one request, its body consumed; None at EOF."""
    data = pending
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    line, _, headers = head.partition(b"\r\n")
    length = 0
    for header in headers.split(b"\r\n"):
        name, _, value = header.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return line, headers, rest[length:]


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN (SO_LINGER with a zero timeout)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _webhook_id(headers: bytes) -> str | None:
    for header in headers.split(b"\r\n"):
        name, _, value = header.partition(b":")
        if name.strip().lower() == b"webhook-id":
            return value.strip().decode()
    return None


class _Handler(socketserver.BaseRequestHandler):
    server: HostileServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pending = b""
        try:
            while not self.server.stopping.is_set():
                request = _read_request(sock, pending)
                if request is None:
                    return
                line, headers, pending = request
                path = line.split(b" ")[1].decode() if line.count(b" ") >= 2 else "/"
                behaviour = path.strip("/").split("/")[0]
                self.server.count(behaviour, path, _webhook_id(headers))
                if not self.answer(sock, behaviour, path):
                    return
        except OSError:
            return  # the client gave up (a timeout, an abort): nothing to answer

    def answer(self, sock: socket.socket, behaviour: str, path: str) -> bool:
        """Answer one request; True to keep the connection for the next one."""
        if behaviour in ("healthy", "healthy-slow"):
            if behaviour == "healthy-slow":
                self.server.stopping.wait(0.5)  # so that a host always has work in flight
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return True
        if behaviour == "reset-headers":
            sock.sendall(b"HTTP/1.1 200 O")
            _reset(sock)
        elif behaviour == "reset-body":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 100)
            _reset(sock)
        elif behaviour == "garbage":
            sock.sendall(b"SURPRISE \x00\xff not http at all\r\n\r\n")
        elif behaviour == "http09":
            sock.sendall(b"<html>an HTTP/0.9 answer has no status line</html>\n")
        elif behaviour == "drip":
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
                if self.server.stopping.wait(1.0):
                    break
                sock.sendall(bytes([byte]))
        elif behaviour == "huge":
            sock.sendall(b"HTTP/1.1 500 Internal Server Error\r\n"
                         b"Content-Length: %d\r\n\r\n" % HUGE_BODY_BYTES)
            chunk = b"y" * 65536
            for _ in range(HUGE_BODY_BYTES // len(chunk)):
                sock.sendall(chunk)
        elif behaviour == "redirect":
            sock.sendall(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n"
                         % path.encode())
            return True
        elif behaviour == "hang":
            self.server.stopping.wait()
        else:
            sock.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return True
        return False


class HostileServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__((host, 0), _Handler)
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        # (path, webhook-id) -> arrivals: one event reaches each destination once
        self.healthy_ids: Counter[tuple[str, str]] = Counter()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def count(self, behaviour: str, path: str, webhook_id: str | None) -> None:
        with self.lock:
            self.requests[behaviour] += 1
            if behaviour.startswith("healthy") and webhook_id is not None:
                self.healthy_ids[(path, webhook_id)] += 1

    def url(self, behaviour: str, name: str = "x") -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/{behaviour}/{name}"

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1, made by the openssl CLI: trusted by nobody."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


class TlsServer(HostileServer):
    """`healthy` behind TLS with a self-signed certificate: every verified client refuses."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        cert, key = self_signed_cert(folder)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)

    def get_request(self) -> tuple[socket.socket, object]:
        sock, address = super().get_request()
        sock.settimeout(10)
        try:
            return self.context.wrap_socket(sock, server_side=True), address
        except (ssl.SSLError, OSError):
            sock.close()  # the client refused our certificate: expected
            raise

    def url(self, behaviour: str = "healthy", name: str = "x") -> str:
        return f"https://127.0.0.1:{self.server_address[1]}/{behaviour}/{name}"

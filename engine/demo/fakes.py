"""The demo's fake webhook receivers, in this process: one loopback HTTP server (the
standard library's) whose path picks a behaviour, plus a port where nothing listens.

Behaviours: `healthy` answers 200 at once; `slow` after SLOW_S; `flaky` fails a share of
its requests with 503 and has an outage of OUTAGE_S every OUTAGE_EVERY_S (so its breaker
opens, probes half-open and closes again); `gone` answers 200 until `gone_after_s`, then
410 Gone (which disables the destination); `dead` is a bound port that never listens, so
connections are refused. Times count from `begin()`, when the traffic starts.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_S = 2.0
FLAKY_FAILURE_SHARE = 0.2
OUTAGE_EVERY_S = 20.0
OUTAGE_S = 6.0
BEHAVIOURS = ("healthy", "slow", "flaky", "gone", "dead")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, gone_after_s: float) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.started = time.monotonic()
        self.gone_after_s = gone_after_s
        self.answers: Counter[tuple[str, int]] = Counter()
        self.lock = threading.Lock()
        self.random = random.Random(16)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver would

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        name = self.path.strip("/")
        status = self._status(name)
        with self.server.lock:
            self.server.answers[(name, status)] += 1
        body = b'{"ok": true}' if status == 200 else b'{"error": "demo"}'
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _status(self, name: str) -> int:
        if name == "slow":
            time.sleep(SLOW_S)
        elif name == "flaky":
            in_outage = (time.monotonic() - self.server.started) % OUTAGE_EVERY_S < OUTAGE_S
            with self.server.lock:
                failed = in_outage or self.server.random.random() < FLAKY_FAILURE_SHARE
            return 503 if failed else 200
        elif name == "gone":
            elapsed = time.monotonic() - self.server.started
            return 410 if elapsed >= self.server.gone_after_s else 200
        elif name != "healthy":
            return 404
        return 200

    def log_message(self, format: str, *args: object) -> None:
        pass  # the live view shows the attempts; no access log on the terminal


class FakeDestinations:
    """Start with `start()`, stop with `stop()`; `url(name)` for each behaviour."""

    def __init__(self, gone_after_s: float) -> None:
        self._server = _Server(gone_after_s)
        # Bound but never listening: every connection is refused, and no other program
        # can take the port while the demo runs.
        self._dead = socket.socket()
        self._dead.bind(("127.0.0.1", 0))
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="demo-destinations", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def begin(self) -> None:
        """Start the behaviours' clocks (the outage, the 410) as the traffic starts."""
        self._server.started = time.monotonic()

    def url(self, name: str) -> str:
        if name == "dead":
            return f"http://127.0.0.1:{self._dead.getsockname()[1]}/dead"
        return f"http://127.0.0.1:{self._server.server_address[1]}/{name}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._dead.close()
        self._thread.join()

"""A real ingress process for tests: `python -m engine.ingress.server` on 127.0.0.1, and a
small HTTP client for it (stdlib http.client, so the tests need nothing else)."""

from __future__ import annotations

import http.client
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from types import TracebackType
from typing import Any, Self

READY_TIMEOUT_S = 20.0
STOP_GRACE_S = 5.0


class Answer:
    def __init__(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"Answer({self.status}, {self.body[:300]!r})"


class IngressProcess:
    """Runs one ingress process for the length of a `with` block."""

    def __init__(
        self, dsn: str, *, token: str | None = None, env: dict[str, str] | None = None,
        args: list[str] | None = None, allow_private_targets: bool = True,
    ) -> None:
        self.argv = [
            sys.executable, "-m", "engine.ingress.server", "--dsn", dsn,
            "--bind", "127.0.0.1:0",
            *(["--allow-private-targets"] if allow_private_targets else []), *(args or []),
        ]
        self.env = {**os.environ, **(env or {})}
        self.env.pop("ENGINE_API_TOKEN", None)
        if token is not None:
            self.env["ENGINE_API_TOKEN"] = token
        self.token = token
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
        )
        try:
            self.port = self._wait_ready()
        except BaseException:
            self.kill()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_ready(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not selector.select(timeout=0.2):
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"ingress exited with {self.proc.returncode}")
                    continue
                line = self.proc.stdout.readline().decode()
                if line.startswith("listening on "):
                    return int(line.rsplit(":", 1)[1])
                if not line:
                    raise RuntimeError(f"ingress exited with {self.proc.wait()}")
        raise RuntimeError("ingress did not start in time")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def request(
        self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
        headers: dict[str, str] | None = None, auth: bool = True, timeout: float = 30.0,
        chunked: bool = False,
    ) -> Answer:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            sent_headers = dict(headers or {})
            if auth and self.token is not None:
                sent_headers.setdefault("Authorization", f"Bearer {self.token}")
            data = raw if raw is not None else (
                json.dumps(body).encode() if body is not None else None
            )
            if data is not None:
                sent_headers.setdefault("Content-Type", "application/json")
            if chunked and data is not None:
                # No Content-Length: the server only learns the size by reading.
                chunks = (data[i : i + 16384] for i in range(0, len(data), 16384))
                conn.request(method, path, body=chunks, headers=sent_headers,
                             encode_chunked=True)
            else:
                conn.request(method, path, body=data, headers=sent_headers)
            response = conn.getresponse()
            return Answer(
                response.status, response.read(),
                {k.lower(): v for k, v in response.getheaders()},
            )
        finally:
            conn.close()

"""A real forward proxy for the egress tests: proxy.py (PyPI) in a child process on
127.0.0.1, with tests/kit/proxy_counter.py logging what it passes upstream."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

ROOT = Path(__file__).parents[2]


class ForwardProxy:
    def __init__(self, directory: Path) -> None:
        self.log = directory / "proxy-requests.log"
        self.port_file = directory / "proxy.port"
        self.stderr_path = directory / "proxy.stderr"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self) -> list[str]:
        """What the proxy passed upstream, one "METHOD host:port" each."""
        return self.log.read_text().splitlines() if self.log.exists() else []

    def __enter__(self) -> Self:
        env = {**os.environ, "ENGINE_TEST_PROXY_LOG": str(self.log),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", "0",
             "--port-file", str(self.port_file), "--threaded",
             "--num-acceptors", "1", "--log-level", "WARNING",
             "--plugins", "tests.kit.proxy_counter.CountingPlugin"],
            env=env, stdout=subprocess.DEVNULL, stderr=self.stderr_path.open("wb"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = self.port_file.read_text().strip() if self.port_file.exists() else ""
            if text:
                self.port = int(text)
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy.py exited: {self.stderr_path.read_text()!r}")
            time.sleep(0.05)
        raise RuntimeError("proxy.py did not start within 30 s")

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

"""Python handle on fakedest.mjs (beside this file, installed with the package), the fake
webhook destination. Usage:

with FakeDestination() as dest:
    url = dest.url("fast/shop")      # give this to the engine as a destination
    ...
    assert dest.stats()["names"]["shop"]["duplicates"] == 0
"""

from __future__ import annotations

import base64
import json
import selectors
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from engine.testing.processes import stop_process

FAKEDEST_JS = Path(__file__).with_name("fakedest.mjs")
READY_TIMEOUT_S = 10.0
STOP_GRACE_S = 3.0

Mode = Literal["ok", "fail", "hang"]


class FakeDestination:
    """Runs fakedest as a subprocess on 127.0.0.1 for the length of a `with` block."""

    def __init__(self, *, secrets: list[str] | None = None, extra_args: list[str] | None = None):
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("FakeDestination needs Node.js: `node` is not on PATH")
        self._argv = [node, str(FAKEDEST_JS), "--port", "0", "--host", "127.0.0.1"]
        for secret in secrets or []:
            self._argv += ["--secret", secret]
        self._argv += extra_args or []
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> Self:
        self._proc = subprocess.Popen(
            # stderr is inherited: pytest captures it and shows it next to a failure.
            self._argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        try:
            self.port = int(json.loads(self._read_ready_line())["port"])
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _read_ready_line(self) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            if sel.select(READY_TIMEOUT_S):
                line = self._proc.stdout.readline()
                if line:
                    return line
        raise RuntimeError(
            f"fakedest did not report its port within {READY_TIMEOUT_S}s "
            f"(exit code {self._proc.poll()}); its stderr says why"
        )

    def stop(self) -> None:
        """SIGTERM (lets --stats-file be written), then SIGKILL after a grace period."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, STOP_GRACE_S)
            assert proc.stdout is not None
            proc.stdout.close()

    @property
    def pid(self) -> int:
        """The Node process id (benchmarks account its CPU time)."""
        assert self._proc is not None, "FakeDestination is not running"
        return self._proc.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, kind_path: str) -> str:
        """URL of one behaviour, e.g. url("slow/200/a") or url("/flaky/30/b")."""
        return f"{self.base_url}/{kind_path.lstrip('/')}"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("content-type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    def stats(self) -> dict[str, Any]:
        """Counters per name under "names", sums under "totals", plus "uptime_ms"."""
        result: dict[str, Any] = self._call("GET", "/_stats")
        return result

    def name_stats(self, name: str) -> dict[str, Any]:
        """Counters of one name; empty if it has seen no request yet."""
        result: dict[str, Any] = self.stats()["names"].get(name, {})
        return result

    def requests(self, name: str) -> list[dict[str, Any]]:
        """The last requests kept for a name, oldest first, with `body` as bytes."""
        kept: list[dict[str, Any]] = self._call("GET", f"/_requests/{name}")
        for entry in kept:
            entry["body"] = base64.b64decode(entry["body"])
        return kept

    def arrivals(self, name: str) -> dict[str, int]:
        """webhook-id -> unix ms at which its first 2xx-answered request arrived."""
        result: dict[str, int] = self._call("GET", f"/_arrivals/{name}")
        return result

    def order(self, name: str) -> list[str]:
        """webhook-ids in arrival order; empty unless started with --record-order."""
        result: list[str] = self._call("GET", f"/_order/{name}")
        return result

    def control(self, name: str, mode: Mode, status: int = 500) -> None:
        """Switch /toggle/<name>: answer 200, answer `status`, or hang."""
        self._call("POST", f"/_control/{name}", {"mode": mode, "status": status})

    def set_secrets(self, name: str, secrets: list[str]) -> None:
        """Check this name's signatures against these whsec_ secrets from now on."""
        self._call("POST", f"/_secrets/{name}", {"secrets": secrets})

    def reset(self) -> None:
        """Clear every counter and kept request; secrets and toggles stay."""
        self._call("POST", "/_reset", {})

    def wait_for(self, name: str, key: str, value: int, timeout: float = 10.0) -> dict[str, Any]:
        """Poll until stats of `name` have `key` >= value; returns those stats."""
        deadline = time.monotonic() + timeout
        while True:
            current = self.name_stats(name)
            if current.get(key, 0) >= value:
                return current
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}.{key} did not reach {value} in {timeout}s: {current}")
            time.sleep(0.05)

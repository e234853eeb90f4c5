"""Serve the ingress app with uvicorn (uvloop, httptools) on a socket.

The supervisor owns the listening socket and hands it to each ingress child, which calls
`run_ingress`. `python -m engine.ingress.server` runs one ingress process on its own (tests
and benches), printing `listening on HOST:PORT` once it accepts connections.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import sys
from collections.abc import Iterator, Sequence

import uvicorn

from engine.config import Settings, load_settings
from engine.ingress.app import IngressApp


def listen(bind: str) -> socket.socket:
    """A listening TCP socket for HOST:PORT (port 0: any free port)."""
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """Says where it listens once startup is complete (tests wait for that line)."""

    def __init__(self, config: uvicorn.Config, announce: str | None) -> None:
        super().__init__(config)
        self.announce = announce

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            # uvicorn re-raises the stop signal once drained, so the process would die of
            # it; for the supervisor a drain asked for by SIGTERM is a clean exit (0).
            self._captured_signals.clear()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.announce and self.started:
            print(self.announce, flush=True)


def run_ingress(
    settings: Settings, dsn: str, sock: socket.socket | None, *, announce: bool = False
) -> None:
    """Run the API until SIGTERM/SIGINT (uvicorn drains open requests, then returns)."""
    if sock is None:
        sock = listen(settings.bind)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        IngressApp(settings, dsn),
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        log_level="warning",
        timeout_graceful_shutdown=settings.drain_deadline_s,
    )
    server = _Server(config, f"listening on {host}:{port}" if announce else None)
    server.run(sockets=[sock])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one ingress process.")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--bind", default="127.0.0.1:0")
    parser.add_argument("--allow-private-targets", action="store_true", default=None)
    parser.add_argument("--max-body-bytes", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    settings = load_settings(
        dsn=args.dsn, allow_private_targets=args.allow_private_targets,
        max_body_bytes=args.max_body_bytes,
    )
    run_ingress(settings, args.dsn, listen(args.bind), announce=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Serve the ingress app with uvicorn (uvloop, httptools) on a socket.

The supervisor owns the listening socket and hands it to each ingress child, which calls
`run_ingress`. `python -m engine.ingress.server` runs one ingress process on its own (tests
and benches), printing `listening on HOST:PORT` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Iterator, Sequence

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from engine.config import Settings, load_settings
from engine.db.database import engine_conninfo
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


class _WritesPerStep:
    """A connection's transport whose writes within one event-loop step go out as one.

    uvicorn writes a response's head and its body separately, and uvloop sends each
    at once: two send() calls per answer, a quarter of the ingress process's CPU per
    event (py-spy, wrk on POST /v1/events). Gathered, they are one send() and one
    segment, a loop callback later (the same loop iteration)."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: list[bytes] | None = None
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if self._held is None:
            self._held = [data]
            self._loop.call_soon(self._flush)
        else:
            self._held.append(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


class _HttpProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_WritesPerStep(transport))  # type: ignore[arg-type]


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
        http=_HttpProtocol,  # httptools, see _WritesPerStep
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
    parser.add_argument("--allow-targets")
    parser.add_argument("--max-body-bytes", type=int)
    parser.add_argument("--portal-frame-ancestors")
    parser.add_argument("--strict-event-types", action="store_true", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    settings = load_settings(
        dsn=args.dsn, allow_private_targets=args.allow_private_targets,
        allow_targets=args.allow_targets,
        max_body_bytes=args.max_body_bytes, strict_event_types=args.strict_event_types,
        portal_frame_ancestors=args.portal_frame_ancestors,
    )
    run_ingress(settings, engine_conninfo(args.dsn), listen(args.bind), announce=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs the demo: database, engine child process, receivers, traffic, view, cleanup."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
from rich.console import Console
from rich.live import Live

from engine.cli.errors import CommandError, database_error
from engine.cli.parent_link import EXIT_WITH_PARENT_ENV
from engine.config import Settings
from engine.db.database import open_database
from engine.db.migrate import migrate
from engine.demo import view
from engine.demo.fakes import BEHAVIOURS, FakeDestinations
from engine.supervisor import open_listen_socket
from engine.testing.processes import stop_process

# Short enough that retries, dead letters and breaker cycles show within a minute.
DEMO_CONFIG = """\
retry_schedule = "2s,4s,8s"
breaker_threshold = 3
breaker_base_pause_ms = 4000
breaker_max_pause_ms = 16000
"""
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
REFRESH_S = 0.5
PLAIN_EVERY_S = 2.0
EVENT_TYPES = ("order.created", "order.paid", "invoice.sent")


def _pick_bind(preferred: str) -> str:
    """The configured address (8080) when free, so README curl lines work; else any port."""
    with contextlib.suppress(OSError):
        open_listen_socket(preferred).close()
        return preferred
    sock = open_listen_socket("127.0.0.1:0")
    port = sock.getsockname()[1]
    sock.close()
    return f"127.0.0.1:{port}"


def _post(url: str, body: bytes, token: str | None) -> tuple[int, bytes]:
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Traffic(threading.Thread):
    """Sends `rate` events per second to POST /v1/events until stopped."""

    def __init__(self, api: str, rate: float, token: str | None) -> None:
        super().__init__(name="demo-traffic", daemon=True)
        self.api, self.rate, self.token = api, rate, token
        self.accepted = 0
        self.refused = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        n = 0
        next_at = time.monotonic()
        while not self.stopped.is_set():
            n += 1
            kind = EVENT_TYPES[n % len(EVENT_TYPES)]
            body = b'{"type": "%s", "payload": {"order": %d, "amount_cents": %d}}' % (
                kind.encode(), n, 100 + n % 900)
            try:
                status, _ = _post(f"{self.api}/v1/events", body, self.token)
            except OSError:
                status = 0
            if status == 202:
                self.accepted += 1
            else:
                self.refused += 1
            next_at += 1.0 / self.rate
            self.stopped.wait(max(0.0, next_at - time.monotonic()))


def _wait_ready(api: str, engine: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if engine.poll() is not None:
            raise CommandError(f"the engine exited with code {engine.returncode}; see {log}")
        with contextlib.suppress(OSError), urllib.request.urlopen(
            f"{api}/healthz", timeout=2
        ) as response:
            if response.status == 200:
                return
        time.sleep(0.1)
    raise CommandError(f"the engine did not answer on {api} within {READY_TIMEOUT_S:.0f} s;"
                       f" see {log}")


def _stop(engine: subprocess.Popen[bytes]) -> None:
    """SIGTERM: the engine drains (answers in flight are recorded), then exits; a second
    SIGTERM after STOP_TIMEOUT_S ends it at once."""
    stop_process(engine, STOP_TIMEOUT_S, 5)


def _create_destinations(settings: Settings, dsn: str, fakes: FakeDestinations) -> dict[int, str]:
    from engine.cli.local_api import LocalApi

    api = LocalApi(dataclasses.replace(settings, allow_private_targets=True), dsn)
    names: dict[int, str] = {}
    for name in BEHAVIOURS:
        # The slow receiver answers in 2 s; the timeout stays above that.
        created = api.check("POST", "/v1/destinations", {"url": fakes.url(name),
                                                         "timeout_ms": 5000}).json()
        names[created["id"]] = name
    return names


def run(settings: Settings, duration_s: float, rate: float) -> int:
    if duration_s <= 0 or rate <= 0:
        raise CommandError("--duration and --rate must be positive")
    console = Console(highlight=False)
    interactive = sys.stdout.isatty()
    database = open_database(settings, announce=False)
    engine: subprocess.Popen[bytes] | None = None
    fakes = FakeDestinations(gone_after_s=duration_s / 3)
    traffic: Traffic | None = None
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        try:
            migrate(database.dsn)
        except psycopg.OperationalError as exc:
            raise database_error(settings.dsn, exc) from None
        fakes.start()
        names = _create_destinations(settings, database.dsn, fakes)
        config = data_dir / "demo.toml"
        config.write_text(DEMO_CONFIG)
        bind = _pick_bind(settings.bind)
        api = f"http://{bind}"
        log = data_dir / "demo-engine.log"
        with log.open("wb") as log_file:
            engine = subprocess.Popen(
                [sys.executable, "-m", "engine.cli", "--dsn", database.dsn, "--config",
                 str(config), "--procs", "1", "--bind", bind, "--allow-private-targets"],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                # Its own session: Ctrl-C reaches the demo, which then stops the engine;
                # and if the demo is killed outright, the engine stops too.
                start_new_session=True,
                env={**os.environ, EXIT_WITH_PARENT_ENV: str(os.getpid())},
            )
        where = "embedded PostgreSQL in ./.engine/" if database.embedded else "--dsn database"
        console.print(f"engine demo: {where}, engine on {api} (log {log}), "
                      f"{len(names)} receivers, {rate:g} events/s for {duration_s:g} s")
        _wait_ready(api, engine, log)
        traffic = Traffic(api, rate, settings.api_token)
        fakes.begin()
        traffic.start()
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            watcher = view.Watcher(conn, names)
            snapshot = _watch(watcher, traffic, duration_s, api, console, interactive)
            traffic.stopped.set()
            traffic.join()
            snapshot = watcher.snapshot(traffic.accepted)
        _stop(engine)
        view.print_summary(console, snapshot, where)
        return 0
    finally:
        if traffic is not None:
            traffic.stopped.set()
        if engine is not None:
            _stop(engine)
        fakes.stop()
        database.close()


def _watch(watcher: view.Watcher, traffic: Traffic, duration_s: float, api: str,
           console: Console, interactive: bool) -> view.Snapshot:
    """Refresh the view until the duration is over or Ctrl-C; returns the last snapshot.

    Ctrl-C sets a flag the loop looks at between refreshes instead of raising wherever
    the main thread is: a KeyboardInterrupt inside a snapshot's query can leave its
    connection mid-statement for the summary's snapshot. (A CI run once saw the demo not
    exit within 120 s of Ctrl-C; this was the likeliest place.)"""
    end = time.monotonic() + duration_s
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    snapshot = watcher.snapshot(traffic.accepted)
    try:
        if interactive:
            with Live(console=console, refresh_per_second=4, transient=False) as live:
                while time.monotonic() < end and not interrupted.is_set():
                    snapshot = watcher.snapshot(traffic.accepted)
                    live.update(view.live_view(snapshot, watcher, duration_s, api))
                    interrupted.wait(REFRESH_S)
        else:
            while time.monotonic() < end and not interrupted.is_set():
                interrupted.wait(min(PLAIN_EVERY_S, max(0.0, end - time.monotonic())))
                if interrupted.is_set():
                    break
                snapshot = watcher.snapshot(traffic.accepted)
                for change in watcher.unprinted:
                    print(f"change {change.strip()}", flush=True)
                watcher.unprinted.clear()
                print(view.progress_line(snapshot), flush=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted.is_set():
        console.print("engine demo: interrupted, stopping")
    return snapshot

"""`engine` (run): the supervisor process.

It opens the database (starting the embedded one if no DSN is given), applies migrations,
then forks its children from a small table of roles: delivery workers, ingress and
maintenance (the last two are registered by their own modules, see ROLES). It restarts a
child that dies (with backoff when it keeps dying), returns a dead worker's claims to
`pending` at once, and drains on SIGTERM/SIGINT; a second signal ends everything at once.
Nothing is lost either way: unfinished claims are released, or come back when their
lease runs out.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from engine.config import Settings
from engine.db import queue
from engine.db.database import open_database
from engine.db.migrate import migrate
from engine.observe import metrics
from engine.observe.oplog import log_event

# A child that lived less than this before dying counts as failing; each such failure in
# a row doubles the wait before the next start, up to MAX_RESTART_DELAY_S.
HEALTHY_AFTER_S = 10.0
FIRST_RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 30.0
# Children get drain_deadline_s to finish, plus this long to record what they did.
DRAIN_GRACE_S = 5.0
LOOP_TICK_S = 0.5
ORPHAN_CHECK_S = 1.0
LISTEN_BACKLOG = 1024


@dataclass(frozen=True)
class ChildContext:
    """What a child process starts with."""

    settings: Settings
    dsn: str
    index: int  # 0-based position within its role
    listen_socket: socket.socket | None  # only for roles with uses_listen_socket


@dataclass(frozen=True)
class ChildRole:
    name: str
    count: Callable[[Settings], int]
    target: Callable[[ChildContext], int]  # runs in the child; its return is the exit code
    holds_claims: bool = False  # its claims go back to pending the moment it dies
    uses_listen_socket: bool = False  # gets the ingress socket the supervisor opened


def _run_worker(context: ChildContext) -> int:
    from engine.worker import run_worker_process

    # On a shared host, accepting comes first: a producer waits for ingress's answer,
    # while delivery is asynchronous and retried anyway. Workers delivering a burst would
    # otherwise take the CPU that ingress needs to answer within milliseconds
    # (docs/decisions/0002-worker-niceness-10.md).
    if context.settings.worker_nice:
        os.nice(context.settings.worker_nice)

    return run_worker_process(context.settings, context.dsn)


def _run_maintenance(context: ChildContext) -> int:
    from engine.maintenance import run_maintenance

    run_maintenance(context.settings, context.dsn)
    return 0


def _run_ingress(context: ChildContext) -> int:
    from engine.ingress.server import run_ingress

    run_ingress(context.settings, context.dsn, context.listen_socket)
    return 0


ROLES: list[ChildRole] = [
    ChildRole("worker", lambda s: s.procs, _run_worker, holds_claims=True),
    ChildRole("ingress", lambda s: s.ingress_procs, _run_ingress, uses_listen_socket=True),
    ChildRole("maintenance", lambda s: 1, _run_maintenance),
]


@dataclass
class _Slot:
    role: ChildRole
    index: int
    pid: int | None = None
    started_at: float = 0.0
    quick_failures: int = 0
    start_at: float = 0.0  # when a stopped slot may start again


def _exit_description(status: int) -> dict[str, object]:
    if os.WIFSIGNALED(status):
        return {"signal": signal.Signals(os.WTERMSIG(status)).name}
    return {"exit_code": os.waitstatus_to_exitcode(status)}


def open_listen_socket(bind: str) -> socket.socket:
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, int(port)), family=family, backlog=LISTEN_BACKLOG)


def _socket_address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Supervisor:
    def __init__(
        self, settings: Settings, dsn: str, roles: list[ChildRole] | None = None
    ) -> None:
        self.settings = settings
        self.dsn = dsn
        roles = ROLES if roles is None else roles
        self.slots = [
            _Slot(role, index) for role in roles for index in range(role.count(settings))
        ]
        self.listen_socket: socket.socket | None = None
        if any(role.uses_listen_socket for role in roles):
            self.listen_socket = open_listen_socket(settings.bind)
        self.signals: list[int] = []
        self.draining = False
        self.kill_at = 0.0

    def run(self) -> int:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        self._wake_fds = (wake_read, wake_write)
        previous_wakeup = signal.set_wakeup_fd(wake_write)
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        try:
            # The bound address, not the setting: port 0 picks a free port (tests).
            log_event("supervisor_started", children=len(self.slots),
                      bind=_socket_address(self.listen_socket) if self.listen_socket else None)
            return self._loop(wake_read)
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_read)
            os.close(wake_write)
            if self.listen_socket is not None:
                self.listen_socket.close()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)

    def _loop(self, wake_read: int) -> int:
        for slot in self.slots:
            self._start(slot)
        while True:
            select.select([wake_read], [], [], self._tick())
            try:
                while os.read(wake_read, 512):
                    pass
            except BlockingIOError:
                pass
            while self.signals:
                signum = self.signals.pop(0)
                if signum == signal.SIGCHLD:
                    continue
                if self.draining:
                    log_event("exit_now", signal=signal.Signals(signum).name)
                    self._kill_all()
                    return 1
                self._begin_drain(signum)
            self._reap()
            now = time.monotonic()
            if self.draining:
                if not any(slot.pid for slot in self.slots):
                    log_event("drain_finished")
                    return 0
                if now >= self.kill_at:
                    log_event("drain_deadline_passed")
                    self._kill_all()
                    log_event("drain_finished")
                    return 0
                continue
            for slot in self.slots:
                if slot.pid is None and now >= slot.start_at:
                    self._start(slot)

    def _tick(self) -> float:
        now = time.monotonic()
        waits = [LOOP_TICK_S]
        waits += [slot.start_at - now for slot in self.slots if slot.pid is None]
        if self.draining:
            waits.append(self.kill_at - now)
        return max(0.0, min(waits))

    def _begin_drain(self, signum: int) -> None:
        self.draining = True
        self.kill_at = time.monotonic() + self.settings.drain_deadline_s + DRAIN_GRACE_S
        log_event("drain_begun", signal=signal.Signals(signum).name,
                  deadline_s=self.settings.drain_deadline_s)
        for slot in self.slots:
            if slot.pid is not None:
                self._signal_child(slot.pid, signal.SIGTERM)

    def _signal_child(self, pid: int, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    def _kill_all(self) -> None:
        for slot in self.slots:
            if slot.pid is not None:
                self._signal_child(slot.pid, signal.SIGKILL)
        for slot in self.slots:
            if slot.pid is not None:
                _, status = os.waitpid(slot.pid, 0)
                self._exited(slot, status)

    def _reap(self) -> None:
        by_pid = {slot.pid: slot for slot in self.slots if slot.pid is not None}
        while by_pid:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = by_pid.pop(pid, None)
            if slot is not None:
                self._exited(slot, status)

    def _exited(self, slot: _Slot, status: int) -> None:
        pid, slot.pid = slot.pid, None
        assert pid is not None
        now = time.monotonic()
        lived = now - slot.started_at
        log_event("child_exited", role=slot.role.name, index=slot.index, child=pid,
                  lived_s=round(lived, 3), **_exit_description(status))
        metrics.child_exited(pid)
        if slot.role.holds_claims:
            self._release_claims(pid)
        slot.quick_failures = slot.quick_failures + 1 if lived < HEALTHY_AFTER_S else 0
        delay = 0.0
        if slot.quick_failures:
            delay = min(MAX_RESTART_DELAY_S,
                        FIRST_RESTART_DELAY_S * 2 ** (slot.quick_failures - 1))
        slot.start_at = now + delay

    def _release_claims(self, pid: int) -> None:
        worker = queue.worker_id(pid=pid)
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                count = queue.release_claims(conn, worker, self.settings.max_attempts)
        except psycopg.Error as exc:
            # The lease returns them later; nothing is lost.
            log_event("claims_release_failed", worker=worker, error=str(exc))
            return
        if count:
            log_event("claims_released", worker=worker, count=count)

    def _start(self, slot: _Slot) -> None:
        restart = slot.started_at > 0
        context = ChildContext(
            self.settings, self.dsn, slot.index,
            self.listen_socket if slot.role.uses_listen_socket else None,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._child(slot.role, context)
        slot.pid = pid
        slot.started_at = time.monotonic()
        log_event("child_restarted" if restart else "child_started", role=slot.role.name,
                  index=slot.index, child=pid)

    def _child(self, role: ChildRole, context: ChildContext) -> None:
        """In the forked child: never returns, and never runs the parent's atexit handlers."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            for fd in self._wake_fds:
                os.close(fd)
            if self.listen_socket is not None and context.listen_socket is None:
                self.listen_socket.close()
            threading.Thread(
                target=_drain_when_orphaned, args=(os.getppid(),), daemon=True,
                name="orphan-watch",
            ).start()
            code = role.target(context)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _drain_when_orphaned(parent: int) -> None:
    """In a child: a supervisor killed with SIGKILL cannot stop its children, so each
    drains by itself (SIGTERM to itself) once its parent is gone."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    log_event("supervisor_gone", parent=parent)
    os.kill(os.getpid(), signal.SIGTERM)


def run_supervisor(settings: Settings) -> int:
    settings.validate()
    database = open_database(settings)
    # Before any fork: every child writes its metrics under this folder, /metrics sums them.
    metrics_dir = metrics.prepare_multiprocess_dir()
    try:
        migrate(database.dsn)
        return Supervisor(settings, database.dsn).run()
    finally:
        metrics.remove_multiprocess_dir(metrics_dir)
        database.close()

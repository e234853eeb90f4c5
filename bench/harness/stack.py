"""The parts a scenario starts and stops: the PostgreSQL server and a fresh database on it,
the engine (`python -m engine.cli`), and process-tree CPU accounting."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg
import psycopg.sql

from bench import benchdb
from engine import queue
from engine.queries import NOTIFY_CHANNEL

ROOT = Path(__file__).resolve().parents[2]
SECRET = benchdb.SECRET
ENGINE_START_TIMEOUT_S = 60.0
ENGINE_STOP_TIMEOUT_S = 40.0
# The settings a reader needs to judge a number: durability, memory, JIT and autovacuum.
PG_SETTINGS = (
    "server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers",
    "work_mem", "jit", "max_connections", "autovacuum", "autovacuum_max_workers",
    "autovacuum_naptime", "autovacuum_vacuum_threshold", "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_insert_threshold", "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_vacuum_cost_delay", "autovacuum_vacuum_cost_limit",
)


class BenchError(Exception):
    """A scenario cannot run or went wrong in a way the operator can act on: one line."""


server = benchdb.server
fresh_database = benchdb.fresh_database


def pg_settings(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name = ANY(%s)",
            (list(PG_SETTINGS),),
        ).fetchall()
    return dict(rows)


def postmaster_pid(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return benchdb.postmaster_pid(conn)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def add_destination(conn: psycopg.Connection, url: str, timeout_ms: int = 10_000) -> int:
    row = conn.execute(
        "INSERT INTO destinations (url, secret, timeout_ms) VALUES (%s, %s, %s) RETURNING id",
        (url, SECRET, timeout_ms),
    ).fetchone()
    assert row is not None
    return int(row[0])


class Engine:
    """`engine --procs N` on a free port, started by `with`, drained by SIGTERM after."""

    def __init__(self, dsn: str, procs: int, extra: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.argv = [sys.executable, "-m", "engine.cli", "--dsn", dsn, "--procs", str(procs),
                     "--bind", f"127.0.0.1:{self.port}", "--allow-private-targets", *extra]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> str:
        """The command line without the DSN (it names a throwaway database)."""
        return "engine " + " ".join(self.argv[5:])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> Engine:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "ENGINE_API_TOKEN"}
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
        while not self._healthy():
            if self.proc.poll() is not None:
                raise BenchError(f"the engine exited at start (code {self.proc.returncode}):"
                                 f" run `{self.command}` by hand to see why")
            if time.monotonic() > deadline:
                raise BenchError(f"the engine did not answer /healthz in "
                                 f"{ENGINE_START_TIMEOUT_S:.0f} s")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/healthz", timeout=2):
                return True
        except OSError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __exit__(self, *exc: object) -> None:
        self.signal_stop()
        self.wait_stopped()

    def signal_stop(self) -> None:
        """SIGTERM: the engine drains (stops claiming, finishes what is in flight)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.wait(ENGINE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=30) as response:
            return response.read().decode()


@contextmanager
def engines(group: Sequence[Engine]) -> Iterator[Sequence[Engine]]:
    """Start several engines at once and stop them at once: their start-ups and drains
    overlap instead of adding up."""
    try:
        for engine in group:
            engine.start()
        for engine in group:
            engine.wait_ready()
        yield group
    finally:
        for engine in group:
            engine.signal_stop()
        for engine in group:
            engine.wait_stopped()


def histogram(text: str, metric: str, label_filter: str = "") -> list[tuple[float, float]]:
    """Cumulative counts per upper bound of a Prometheus histogram (summed over label sets
    matching `label_filter`, e.g. 'route="create_event"'), from /metrics text."""
    buckets: dict[float, float] = {}
    look = f'(?=[^}}]*{re.escape(label_filter)})' if label_filter else ""
    pattern = re.compile(
        rf'^{re.escape(metric)}_bucket\{{{look}[^}}]*le="([^"]+)"[^}}]*\}} (\S+)$', re.MULTILINE)
    for le, count in pattern.findall(text):
        bound = float("inf") if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + float(count)
    return sorted(buckets.items())


def histogram_quantiles_ms(
    before: list[tuple[float, float]], after: list[tuple[float, float]],
    quantiles: Sequence[float] = (0.5, 0.99),
) -> dict[str, float | None]:
    """Bucket upper bounds (ms) under which each quantile of the observations made between
    two readings falls: a histogram tells no finer than its buckets."""
    earlier = dict(before)
    delta = [(bound, count - earlier.get(bound, 0.0)) for bound, count in after]
    total = delta[-1][1] if delta else 0.0
    found: dict[str, float | None] = {}
    for q in quantiles:
        bound = next((b for b, c in delta if total and c >= q * total), None)
        found[f"p{round(q * 100)}_le_ms"] = None if bound is None else bound * 1000
    found["count"] = total
    return found


def tree_cpu(pids: Sequence[int]) -> dict[int, float]:
    """CPU seconds (user + system) of processes and all their live descendants, by pid."""
    seen: dict[int, float] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            seen[proc.pid] = times.user + times.system
    return seen


class CpuMeter:
    """CPU seconds per named part (engine, postgres, destination, locust) between calls of
    `take`. `poll` as often as processes may come and go: a process that ended counts
    with the CPU it had when last polled (psutil cannot read a reaped process)."""

    def __init__(self, parts: dict[str, list[int]]) -> None:
        self.parts = parts
        self.seen: dict[str, dict[int, float]] = {name: {} for name in parts}
        self.poll()
        self.last = self._totals()

    def add(self, name: str, pids: list[int]) -> None:
        self.parts[name] = pids
        self.seen[name] = {}
        self.poll()
        self.last[name] = 0.0

    def poll(self) -> None:
        for name, pids in self.parts.items():
            self.seen[name].update(tree_cpu(pids))

    def _totals(self) -> dict[str, float]:
        return {name: sum(by_pid.values()) for name, by_pid in self.seen.items()}

    def take(self) -> dict[str, float]:
        """CPU seconds each part used since the previous call."""
        self.poll()
        now = self._totals()
        used = {name: round(max(0.0, now[name] - self.last.get(name, 0.0)), 3)
                for name in now}
        self.last = now
        return used


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                           text=True, check=False, timeout=10).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def machine() -> dict[str, Any]:
    import platform

    return {
        "cpus": os.cpu_count(), "platform": platform.platform(),
        "python": platform.python_version(), "memory_gb": round(
            psutil.virtual_memory().total / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


@contextmanager
def held_xmin(dsn: str) -> Iterator[None]:
    """A REPEATABLE READ transaction that has taken its snapshot and stays open: vacuum in
    this database cannot remove any tuple that died after it began."""
    with psycopg.connect(dsn) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM destinations")
        try:
            yield
        finally:
            conn.rollback()


def run_sql(conn: psycopg.Connection, statement: str, params: Sequence[object] = ()
            ) -> list[tuple[Any, ...]]:
    """One of bench/harness/sql/*.sql ($1-style parameters, as the engine's files)."""
    cursor = psycopg.RawCursor(conn)
    cursor.execute(statement, params)
    return cursor.fetchall() if cursor.description else []


@contextmanager
def server_setting(admin_dsn: str, name: str, value: str) -> Iterator[None]:
    """ALTER SYSTEM SET name = value and reload, reset afterwards (a server we started)."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("ALTER SYSTEM SET {} = {}").format(
            psycopg.sql.Identifier(name), psycopg.sql.Literal(value)))
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("ALTER SYSTEM RESET {}").format(
                psycopg.sql.Identifier(name)))
            conn.execute("SELECT pg_reload_conf()")


class Loader:
    """Enqueues `rate` events/s in 100 ms batches on a thread, as ingress does (one
    transaction and one NOTIFY per batch); event i goes to `route(i)`. Used where what
    is measured is delivery, not ingress: it costs far less CPU than HTTP load."""

    PERIOD_S = 0.1

    def __init__(self, dsn: str, rate: float, route: Callable[[int], list[int]],
                 payload: str) -> None:
        self.dsn, self.rate, self.route, self.payload = dsn, rate, route, payload
        self.enqueued = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Loader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        started = time.monotonic()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                due = int(self.rate * (time.monotonic() - started + self.PERIOD_S))
                events = [queue.EventIn("order.created", self.payload, self.route(i))
                          for i in range(self.enqueued, due)]
                if events:
                    with conn.transaction():
                        queue.enqueue_events(conn, events)
                    conn.execute(psycopg.sql.SQL("NOTIFY {}").format(
                        psycopg.sql.Identifier(NOTIFY_CHANNEL)))
                    self.enqueued = due
                self._stop.wait(self.PERIOD_S)


@contextmanager
def fresh_databases(admin_dsn: str, names: Sequence[str]) -> Iterator[list[str]]:
    """Several fresh migrated databases, created side by side (migrations overlap)."""
    from concurrent.futures import ThreadPoolExecutor

    with ExitStack() as stack_, ThreadPoolExecutor(len(names)) as pool:
        managers = [fresh_database(admin_dsn, name) for name in names]
        dsns = list(pool.map(stack_.enter_context, managers))
        yield dsns


def destination_totals(dest: Any) -> dict[str, Any] | None:
    """The fake destination's totals (deliveries, duplicates, signature checks, its own
    CPU), or None if it does not answer in time on an overloaded machine."""
    try:
        stats = dest.stats()
    except OSError:
        return None
    keys = ("requests", "delivered_ids", "duplicates", "sig_ok", "sig_bad", "responses")
    return {**{k: stats["totals"].get(k) for k in keys},
            "cpu_user_ms": stats.get("cpu_user_ms"), "cpu_system_ms": stats.get("cpu_system_ms"),
            "uptime_ms": stats.get("uptime_ms")}

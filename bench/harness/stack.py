"""The parts a scenario starts and stops: the PostgreSQL server (given, a stock PostgreSQL 15
cluster, or an embedded durable PostgreSQL 18) and fresh databases on it, what the server is
and how it is set up, the engine (`python -m engine.cli`), destinations and load, and
process-tree CPU accounting."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from engine.db.database import engine_conninfo
from engine.db.migrate import migrate
from engine.db.queries import NOTIFY_CHANNEL
from engine.db.queue_async import enqueue_events
from engine.domain import DEFAULT_TENANT_ID, EventIn
from engine.testing.pgserver import throwaway_server

ROOT = Path(__file__).resolve().parents[2]
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ENGINE_START_TIMEOUT_S = 60.0
ENGINE_STOP_TIMEOUT_S = 40.0
# Events per enqueue statement when a scenario loads a backlog.
ENQUEUE_BATCH = 5000
PG15_BIN = Path("/usr/lib/postgresql/15/bin")
# The settings a reader needs to judge a number: build, durability, memory, JIT and
# autovacuum.
PG_SETTINGS = (
    "server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers",
    "work_mem", "wal_level", "jit", "jit_above_cost", "max_connections", "autovacuum",
    "autovacuum_max_workers", "autovacuum_naptime", "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_scale_factor", "autovacuum_vacuum_insert_threshold",
    "autovacuum_vacuum_insert_scale_factor", "autovacuum_vacuum_cost_delay",
    "autovacuum_vacuum_cost_limit",
)
# What ingress sends after each commit, so the workers claim at once.
NOTIFY = sql.SQL("NOTIFY {}").format(sql.Identifier(NOTIFY_CHANNEL))


class BenchError(Exception):
    """A scenario cannot run or went wrong in a way the operator can act on: one line."""


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """--dsn and --stock-pg15, which every scenario takes."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--dsn", help="PostgreSQL server to use (a database is created on it"
                       " and dropped); default: a durable embedded PostgreSQL 18")
    where.add_argument(
        "--stock-pg15", action="store_true",
        help="a throwaway cluster of the machine's PostgreSQL 15 with its packaged defaults"
             " (JIT on), as a new user's server")


@contextmanager
def stock_pg15() -> Iterator[str]:
    """An admin DSN of a throwaway cluster of Debian's postgresql-15 with initdb's defaults
    (JIT on, fsync and synchronous_commit on, shared_buffers 128MB), as tools/with-pg15.sh
    starts one: loopback only, run as `postgres` when we are root (PostgreSQL refuses root),
    stopped and deleted afterwards."""
    if not (PG15_BIN / "initdb").exists():
        raise SystemExit(f"--stock-pg15: no PostgreSQL 15 in {PG15_BIN}"
                         " (apt-get install -y postgresql-15)")
    folder = Path(tempfile.mkdtemp(prefix="engine-bench-pg15-"))
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    if as_postgres:
        shutil.chown(folder, "postgres")
    data = folder / "db"
    subprocess.run([*as_postgres, str(PG15_BIN / "initdb"), "-D", str(data), "-U", "postgres",
                    "--auth=trust", "-E", "UTF8"], check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    options = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories=''"
               " -c max_connections=200")
    subprocess.run([*as_postgres, str(PG15_BIN / "pg_ctl"), "-D", str(data), "-w", "-l",
                    str(folder / "server.log"), "-o", options, "start"],
                   check=True, stdout=subprocess.DEVNULL)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_postgres, str(PG15_BIN / "pg_ctl"), "-D", str(data), "-m", "fast",
                        "-w", "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def server(dsn: str | None, *, stock_pg15_cluster: bool = False) -> Iterator[str]:
    """An admin DSN: the one given, a stock PostgreSQL 15 cluster (`stock_pg15_cluster`),
    or an embedded server with fsync and synchronous_commit on; the last two are stopped
    afterwards."""
    if dsn:
        yield dsn
    elif stock_pg15_cluster:
        with stock_pg15() as admin_dsn:
            yield admin_dsn
    else:
        with throwaway_server(durable=True, prefix="engine-bench-pg-") as admin_dsn:
            yield admin_dsn


@contextmanager
def fresh_database(admin_dsn: str, name: str, *, migrated: bool = True) -> Iterator[str]:
    """A newly created database (migrated unless told otherwise), dropped afterwards."""
    ident = sql.Identifier(name)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = name
    url = make_conninfo(**params)
    if migrated:
        migrate(url)
    try:
        yield url
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


@contextmanager
def fresh_databases(admin_dsn: str, names: Sequence[str]) -> Iterator[list[str]]:
    """Several fresh migrated databases, created side by side (migrations overlap)."""
    from concurrent.futures import ThreadPoolExecutor

    with ExitStack() as stack_, ThreadPoolExecutor(len(names)) as pool:
        managers = [fresh_database(admin_dsn, name) for name in names]
        dsns = list(pool.map(stack_.enter_context, managers))
        yield dsns


def _settings(conn: psycopg.Connection) -> dict[str, str]:
    # current_setting() shows a value with its unit as one reads it ("128MB"); pg_settings
    # gives it in the unit's multiples ("16384" of "8kB").
    rows = conn.execute(
        "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
        (list(PG_SETTINGS),),
    ).fetchall()
    return dict(rows)


def pg_settings(dsn: str) -> dict[str, str]:
    """The server's settings a report names (PG_SETTINGS)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return _settings(conn)


def server_report(conn: psycopg.Connection) -> dict[str, Any]:
    """What a drain report says about the server: its settings (PG_SETTINGS), build and
    version, and JIT as the server has it and as the engine's sessions get it
    (engine.db.database.engine_conninfo turns it off)."""
    report: dict[str, Any] = _settings(conn)
    row = conn.execute("SELECT version(), pg_jit_available()").fetchone()
    assert row is not None
    report["server_build"], report["jit_compiles"] = row
    with psycopg.connect(engine_conninfo(conn.info.dsn), password=conn.info.password or None,
                         autocommit=True) as engine_session:
        row = engine_session.execute(
            "SELECT current_setting('jit'), pg_jit_available()").fetchone()
    assert row is not None
    report["engine_session_jit"], report["engine_session_jit_compiles"] = row
    return report


def postmaster_pid(conn: psycopg.Connection) -> int:
    """The server's main process (the parent of this connection's backend), whose process
    tree is the PostgreSQL CPU a bench reports."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return psutil.Process(int(row[0])).ppid()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def add_destination(conn: psycopg.Connection, url: str, timeout_ms: int = 10_000, *,
                    max_in_flight: int | None = None, rate_limit: float | None = None,
                    tenant_id: int = DEFAULT_TENANT_ID) -> int:
    row = conn.execute(
        "INSERT INTO destinations (url, secret, timeout_ms, max_in_flight, rate_limit,"
        "                          tenant_id)"
        " VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
        (url, SECRET, timeout_ms, max_in_flight, rate_limit, tenant_id),
    ).fetchone()
    assert row is not None
    return int(row[0])


async def enqueue(conn: psycopg.AsyncConnection, events: Sequence[EventIn]) -> None:
    """`events` with the engine's own enqueue statement, ENQUEUE_BATCH to a statement, in
    the caller's transaction (or each statement its own in autocommit)."""
    for start in range(0, len(events), ENQUEUE_BATCH):
        await enqueue_events(conn, events[start:start + ENQUEUE_BATCH])


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
        conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(
            sql.Identifier(name), sql.Literal(value)))
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(name)))
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
        asyncio.run(self._load())

    async def _load(self) -> None:
        started = time.monotonic()
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                due = int(self.rate * (time.monotonic() - started + self.PERIOD_S))
                events = [EventIn("order.created", self.payload, self.route(i))
                          for i in range(self.enqueued, due)]
                if events:
                    async with conn.transaction():
                        await enqueue(conn, events)
                    await conn.execute(NOTIFY)
                    self.enqueued = due
                await asyncio.sleep(self.PERIOD_S)


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

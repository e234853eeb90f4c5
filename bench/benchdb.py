"""What the database benchmarks share: a server (--dsn, else --stock-pg15: a throwaway
cluster of the machine's PostgreSQL 15 with its packaged defaults, else an embedded
PostgreSQL 18 with fsync on in a temporary folder), a fresh migrated database on it, a
million finished deliveries to sit beside the queue, what the server is and how it is set
up, latency summaries and the report file."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from engine.database import engine_conninfo
from engine.embedded import ensure_server
from engine.migrate import migrate

REPORTS = Path(__file__).resolve().parent / "reports"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


PG15_BIN = Path("/usr/lib/postgresql/15/bin")


@contextmanager
def stock_pg15() -> Iterator[str]:
    """An admin DSN of a throwaway cluster of Debian's postgresql-15 with initdb's defaults
    (JIT on, fsync and synchronous_commit on, shared_buffers 128MB), as tools/with-pg15.sh
    starts one: loopback only, run as `postgres` when we are root (PostgreSQL refuses root),
    stopped and deleted afterwards."""
    if not (PG15_BIN / "initdb").exists():
        raise SystemExit(f"--stock-pg15: no PostgreSQL 15 in {PG15_BIN}"
                         " (apt-get install postgresql-15)")
    folder = Path(tempfile.mkdtemp(prefix="engine-bench-pg15-"))
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    if as_postgres:
        shutil.chown(folder, "postgres")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = folder / "db"
    subprocess.run([*as_postgres, str(PG15_BIN / "initdb"), "-D", str(data), "-U", "postgres",
                    "--auth=trust", "-E", "UTF8"], check=True, stdout=subprocess.DEVNULL)
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
    or an embedded durable server; the last two are stopped afterwards."""
    if dsn:
        yield dsn
        return
    if stock_pg15_cluster:
        with stock_pg15() as admin_dsn:
            yield admin_dsn
        return
    folder = Path(tempfile.mkdtemp(prefix="engine-bench-pg-"))
    embedded = ensure_server(folder / "data", durable=True)
    try:
        yield embedded.dsn
    finally:
        embedded.stop()
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def fresh_database(admin_dsn: str, name: str) -> Iterator[str]:
    """A newly created, migrated database, dropped afterwards."""
    ident = sql.Identifier(name)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = name
    url = make_conninfo(**params)
    migrate(url)
    try:
        yield url
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


def add_destinations(conn: psycopg.Connection, count: int) -> list[int]:
    rows = conn.execute(
        "INSERT INTO destinations (url, secret)"
        " SELECT 'http://127.0.0.1:9/' || g, %s FROM generate_series(1, %s) g RETURNING id",
        (SECRET, count),
    ).fetchall()
    return [int(r[0]) for r in rows]


def add_finished(conn: psycopg.Connection, count: int, destinations: Sequence[int]) -> None:
    """`count` finished deliveries (1 % dead), each with its own event, as history."""
    with conn.transaction():
        first = _next_value(conn, "SELECT nextval(pg_get_serial_sequence('events', 'id'))")
        conn.execute(
            "INSERT INTO events (id, type, payload, delivery_count, created_at)"
            " OVERRIDING SYSTEM VALUE"
            " SELECT %s + g, 'order.created', '{\"order\": ' || g || '}', 1,"
            "        now() - interval '2 days' + g * interval '100 ms'"
            " FROM generate_series(0, %s - 1) g",
            (first, count),
        )
        conn.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), %s)",
                     (first + count,))
        start = _next_value(conn, "SELECT nextval('delivery_id_seq')")
        # Without the foreign-key triggers (superuser only) this is three times faster;
        # every referenced row exists.
        if _next_value(conn, "SELECT current_setting('is_superuser')::bool::int"):
            conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(
            "INSERT INTO finished_deliveries (id, event_id, destination_id, status, attempt,"
            "                                 next_attempt_at, created_at, completed_at)"
            " SELECT %s + g, %s + g, (%s::bigint[])[1 + g %% %s],"
            "        CASE WHEN g %% 100 = 0 THEN 'dead' ELSE 'delivered' END::delivery_status,"
            "        1, t, t, t + interval '1 s'"
            " FROM generate_series(0, %s - 1) g,"
            "      LATERAL (SELECT now() - interval '2 days' + g * interval '100 ms' AS t) ts",
            (start, first, list(destinations), len(destinations), count),
        )
        conn.execute("SELECT setval('delivery_id_seq', %s)", (start + count,))
    conn.execute("VACUUM (ANALYZE) events, finished_deliveries")


def _next_value(conn: psycopg.Connection, query: str) -> int:
    row = conn.execute(query).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])


def postmaster_pid(conn: psycopg.Connection) -> int:
    """The server's main process (the parent of this connection's backend), whose process
    tree is the PostgreSQL CPU a bench reports."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return psutil.Process(int(row[0])).ppid()


def settings(conn: psycopg.Connection) -> dict[str, str]:
    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes",
             "shared_buffers", "wal_level", "jit", "jit_above_cost")
    # current_setting() shows a value with its unit as one reads it ("128MB"); pg_settings
    # gives it in the unit's multiples ("16384" of "8kB").
    rows = conn.execute(
        "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
        (list(names),),
    ).fetchall()
    return {name: value for name, value in rows}


def server_report(conn: psycopg.Connection) -> dict[str, Any]:
    """What a report must say about the server: its build and version, its durability and
    memory settings, and JIT as the server has it and as the engine's sessions get it
    (engine.database.engine_conninfo turns it off)."""
    report: dict[str, Any] = settings(conn)
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


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean of durations in seconds, as milliseconds (nearest rank)."""
    ordered = sorted(seconds)

    def rank(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {
        "p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99),
        "max": round(ordered[-1] * 1000, 3),
        "mean": round(sum(ordered) / len(ordered) * 1000, 3),
    }


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}


def write_report(name: str, result: dict[str, Any], markdown: str) -> Path:
    """Print the JSON and a Markdown line; keep the JSON under bench/reports/."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    REPORTS.mkdir(exist_ok=True)
    path = REPORTS / f"{name}-{stamp}.json"
    text = json.dumps(result, indent=2)
    path.write_text(text + "\n")
    print(text)
    print(markdown)
    return path

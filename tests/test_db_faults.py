"""Database faults under load, against a real `engine` and a PostgreSQL server this module
owns (so it may stop, crash and restart it): fast and immediate restarts, refusing
connections for OUTAGE_S, a transaction holding xmin for the whole run, and statement
timeouts hit by the claim.

For each: nothing accepted is lost or left in flight, duplicates stay within what was in
flight, ingress refuses fast while it cannot commit (no pool wait), /healthz tells the
truth soon after the database is back, no request after that meets a broken connection,
and each process logs the outage once (and a summary), not once per request. Each test
prints a `FAULT` line with its numbers (pytest -s shows them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from engine.db.embedded import EmbeddedServer, ensure_server
from engine.ingress.dbgate import POOL_TIMEOUT_S
from engine.testing.fakedest import FakeDestination
from engine.testing.ingress_server import IngressProcess
from tests.kit.dbserver import DatabaseFactory
from tests.kit.enginerun import Engine, wait_until
from tests.kit.faultload import DatabaseWatch, FaultLoad, first_ok_after

# How long the server refuses connections in the outage test (the issue asks for 20 s).
OUTAGE_S = float(os.environ.get("ENGINE_FAULT_OUTAGE_S", "20"))
WORKER_PROCS = 2
MAX_IN_FLIGHT = 50
# README (Reliability): "/healthz returns 200 within a fraction of a second of the
# database coming back". Measured from the first connection the server accepts again
# (tests/kit/faultload.DatabaseWatch, or the fault's end when it never refused one) to the
# first 200, with /healthz polled every 25 ms; ingress probes every 0.2 s.
HEALTHZ_BACK_WITHIN_S = 1.0


@pytest.fixture(scope="module")
def owned_server() -> Iterator[EmbeddedServer]:
    # Not under pytest's tmp_path: every pytest session run as this user makes its base
    # folder private again, locking the server's system user out of a restart.
    folder = Path(tempfile.mkdtemp(prefix="engine-fault-pg-"))
    # Durable: an immediate shutdown must not lose what was committed (with
    # synchronous_commit off it would, and the test would blame the engine).
    server = ensure_server(folder / "data", durable=True)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def factory(owned_server: EmbeddedServer) -> Iterator[DatabaseFactory]:
    made = DatabaseFactory(owned_server.dsn)
    yield made
    made.drop_all()


@pytest.fixture
def fault_dsn(factory: DatabaseFactory) -> Iterator[str]:
    url = factory.create()
    yield url
    factory.drop(url)


Fault = Callable[[EmbeddedServer, str], tuple[float, float]]


def _server_log(server: EmbeddedServer) -> list[str]:
    # Without a log file the new postmaster keeps pg_ctl's stdout open: pg_ctl's caller
    # would wait for it to close.
    return ["-l", str(server.data_dir / "server.log")]


def fast_restart(server: EmbeddedServer, dsn: str) -> tuple[float, float]:
    down = time.monotonic()
    server.control("-m", "fast", "-w", "-t", "60", *_server_log(server), "restart")
    return down, time.monotonic()


def immediate_restart(server: EmbeddedServer, dsn: str) -> tuple[float, float]:
    down = time.monotonic()  # a crash: no goodbye to sessions, then crash recovery
    server.control("-m", "immediate", "-w", "-t", "60", *_server_log(server), "restart")
    return down, time.monotonic()


def refuse_connections(server: EmbeddedServer, dsn: str) -> tuple[float, float]:
    down = time.monotonic()
    server.control("-m", "fast", "-w", "-t", "60", "stop")
    time.sleep(OUTAGE_S)
    server.control("-w", "-t", "60", *_server_log(server), "start")
    return down, time.monotonic()


def lock_out_claims(server: EmbeddedServer, dsn: str) -> tuple[float, float]:
    """Every claim (and commit) waits for the table lock past its statement timeout."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET statement_timeout = 0")
        down = time.monotonic()
        conn.execute("LOCK TABLE deliveries IN EXCLUSIVE MODE")
        time.sleep(3)
    return down, time.monotonic()


def _run_fault(
    name: str, fault: Fault, server: EmbeddedServer, dsn: str, tmp_path: Path,
    *, expect_outage: bool = True,
) -> dict[str, object]:
    with FakeDestination() as fake, Engine(
        dsn, tmp_path, "--procs", str(WORKER_PROCS), "--bind", "127.0.0.1:0",
        "--allow-private-targets", "--max-in-flight", str(MAX_IN_FLIGHT),
    ) as engine:
        [started] = wait_until(lambda: engine.events("supervisor_started"), 30, "supervisor")
        client = IngressProcess(dsn)  # only its HTTP client: the engine serves
        client.port = int(started["bind"].rsplit(":", 1)[1])
        wait_until(lambda: _answers(client, "/healthz") == 200, 30, "ingress")
        created = client.request("POST", "/v1/destinations", {"url": fake.url("fast/db")})
        assert created.status == 201, created

        load = FaultLoad(client, created.json()["id"]).start()
        try:
            load.wait_accepted(50)
            watch = DatabaseWatch(dsn).start()
            try:
                down_at, back_at = fault(server, dsn)
            finally:
                watch.stop()
            load.wait_accepted(50)
        finally:
            load.stop()
        # The database came back when it accepted a connection again: pg_ctl reports it
        # up to a poll interval later.
        came_back = back_at if watch.back_at is None else min(watch.back_at, back_at)

        # Every accepted event delivered, or nothing left to deliver: what is neither
        # delivered nor still in the queue then is lost.
        wait_until(lambda: _all_delivered(fake, load) or _unfinished(dsn) == 0, 120,
                   "every delivery made, or none left pending or in flight")
        wait_until(lambda: _unfinished(dsn) == 0, 60, "no delivery pending or in flight")
        lost = _lost(fake, load, dsn)
        stats = fake.name_stats("db")
        log_text = engine.log_path.read_text()
        outages = engine.events("database_unavailable")
        recoveries = engine.events("database_recovered")
    refusals = [s for s in load.posts + load.reads if s.status == 503]
    result: dict[str, object] = {
        "fault": name,
        "accepted": len(load.accepted),
        "lost": len(lost),
        "duplicates": stats["duplicates"],
        "refused_503": len(refusals),
        "slowest_503_s": round(max((s.seconds for s in refusals), default=0.0), 3),
        "healthz_ok_after_s": _round(first_ok_after(load.health, 200, came_back)),
        "pg_ctl_late_s": round(back_at - came_back, 3),
        "first_202_after_s": _round(first_ok_after(load.posts, 202, back_at)),
        "outage_s": round(back_at - down_at, 1),
        "log_lines": len(log_text.splitlines()),
        "outage_lines": dict(Counter(r["component"] for r in outages)),
    }
    print(f"\nFAULT {result}")
    result["outage_records"] = outages
    result["recovery_records"] = recoveries

    # Nothing is left in the queue by now: no lost event means every one was delivered.
    assert not lost, f"{len(lost)} accepted events neither delivered nor queued: {lost[:20]}"
    # Duplicates only from deliveries whose result a fault kept from being recorded:
    # never more than what was in flight.
    assert stats["duplicates"] <= WORKER_PROCS * MAX_IN_FLIGHT
    assert "Traceback" not in log_text
    # 503 at once, not after a pool wait.
    assert all(s.seconds < POOL_TIMEOUT_S for s in refusals), refusals
    healthz_back = first_ok_after(load.health, 200, came_back)
    assert healthz_back is not None and healthz_back < HEALTHZ_BACK_WITHIN_S, (
        f"/healthz answered 200 {healthz_back} s after the database came back",
        [s for s in load.health if s.sent >= came_back][:40])
    # Once /healthz says so, no request meets a connection the fault broke.
    healthy_again = came_back + healthz_back
    late = [s for s in load.posts + load.reads if s.sent > healthy_again and s.status >= 500]
    assert not late, late
    # One line per outage per process and component (a restart may be seen as two: the
    # shutdown, then the start-up), each closed by a summary.
    per_process = Counter((r["pid"], r["component"]) for r in outages)
    assert all(n <= 2 for n in per_process.values()), outages
    if expect_outage:
        assert outages
    assert Counter((r["pid"], r["component"]) for r in recoveries) == per_process
    return result


def _answers(client: IngressProcess, path: str) -> int:
    try:
        return client.request("GET", path, timeout=5).status
    except OSError:
        return 0


def _all_delivered(fake: FakeDestination, load: FaultLoad) -> bool:
    arrivals = fake.arrivals("db")
    return all(f"evt_{event_id}" in arrivals for event_id in load.accepted.values())


def _lost(fake: FakeDestination, load: FaultLoad, dsn: str) -> list[int]:
    """Accepted events that reached the destination nowhere and have no delivery left in
    the queue. The queue is read first: a delivery leaves it only once its answer came, so
    one missed there has arrived by the time the arrivals are read."""
    accepted = sorted(load.accepted.values())
    with psycopg.connect(dsn, autocommit=True) as conn:
        queued = {row[0] for row in conn.execute(
            "SELECT DISTINCT event_id FROM deliveries WHERE event_id = ANY (%s)"
            " AND status IN ('pending', 'in_flight')", [accepted])}
    arrivals = fake.arrivals("db")
    return [event_id for event_id in accepted
            if f"evt_{event_id}" not in arrivals and event_id not in queued]


def _unfinished(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM deliveries WHERE status IN ('pending', 'in_flight')"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _attempts(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM delivery_attempts").fetchone()
    assert row is not None
    return int(row[0])


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def test_fast_restart(owned_server: EmbeddedServer, fault_dsn: str, tmp_path: Path) -> None:
    _run_fault("fast restart", fast_restart, owned_server, fault_dsn, tmp_path)


def test_immediate_restart(
    owned_server: EmbeddedServer, fault_dsn: str, tmp_path: Path
) -> None:
    _run_fault("immediate restart", immediate_restart, owned_server, fault_dsn, tmp_path)


def test_refusing_connections(
    owned_server: EmbeddedServer, fault_dsn: str, tmp_path: Path
) -> None:
    result = _run_fault(
        f"refusing connections {OUTAGE_S:g} s", refuse_connections, owned_server, fault_dsn,
        tmp_path,
    )
    assert result["refused_503"], "nothing was refused while the database was down"


def test_statement_timeout_hit_by_the_claim(
    owned_server: EmbeddedServer, fault_dsn: str, tmp_path: Path
) -> None:
    # In the DSN, as an operator would set it: the engine's own statement_timeout (30 s,
    # engine/db/database.py) outranks a database-level setting but not the DSN's options.
    params = conninfo_to_dict(fault_dsn)
    params["options"] = "-c statement_timeout=500ms"
    result = _run_fault("statement timeout on claim", lock_out_claims, owned_server,
                        make_conninfo(**params), tmp_path)
    outages = result["outage_records"]
    recoveries = result["recovery_records"]
    assert isinstance(outages, list) and isinstance(recoveries, list)
    # The worker's episode opens with whichever of its statements timed out first (a
    # claim or a record: the lock holds both), and its summary counts the claims too.
    assert any(
        r["component"] == "worker" and "statement timeout" in r["error"] for r in outages
    ), outages
    assert any(
        r["component"] == "worker" and r["failures"].get("claim") for r in recoveries
    ), recoveries


def test_transaction_holding_xmin_for_the_whole_run(
    owned_server: EmbeddedServer, fault_dsn: str, tmp_path: Path
) -> None:
    with contextlib.closing(psycopg.connect(fault_dsn, autocommit=True)) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM deliveries")  # takes the snapshot: xmin held

        def hold(server: EmbeddedServer, dsn: str) -> tuple[float, float]:
            start = time.monotonic()
            time.sleep(5)
            return start, time.monotonic()

        result = _run_fault("xmin held all run", hold, owned_server, fault_dsn, tmp_path,
                            expect_outage=False)
        with psycopg.connect(fault_dsn, autocommit=True) as conn:
            held = conn.execute(
                "SELECT backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = %s",
                [holder.info.backend_pid],
            ).fetchone()
        assert held == (True,)
    assert result["refused_503"] == 0


def test_idle_engine_serves_the_first_requests_after_a_restart(
    owned_server: EmbeddedServer, fault_dsn: str, tmp_path: Path
) -> None:
    """No traffic across the restart: every pooled and idle connection is stale when the
    first requests and the first result come."""
    with FakeDestination() as fake, Engine(
        fault_dsn, tmp_path, "--procs", "1", "--bind", "127.0.0.1:0",
        "--allow-private-targets",
    ) as engine:
        [started] = wait_until(lambda: engine.events("supervisor_started"), 30, "supervisor")
        client = IngressProcess(fault_dsn)
        client.port = int(started["bind"].rsplit(":", 1)[1])
        wait_until(lambda: _answers(client, "/healthz") == 200, 30, "ingress")
        created = client.request("POST", "/v1/destinations", {"url": fake.url("fast/idle")})
        assert created.status == 201
        destination = created.json()["id"]
        first = client.request("POST", "/v1/events", {"type": "t", "payload": 1})
        assert first.status == 202
        fake.wait_for("idle", "delivered_ids", 1, timeout=30)
        # Its result recorded before the restart: a flush still under way when the server
        # stops is a real failure of that record, not a stale connection.
        wait_until(lambda: _attempts(fault_dsn) == 1, 30, "the first result recorded")
        # Every pool connection used and idle, the worker's results connection too.
        for _ in range(8):
            assert client.request("GET", "/v1/deliveries?limit=1").status == 200

        fast_restart(owned_server, fault_dsn)

        assert client.request("GET", "/v1/deliveries?limit=1").status == 200
        assert client.request("GET", f"/v1/destinations/{destination}").status == 200
        assert client.request(
            "POST", "/v1/destinations", {"url": fake.url("fast/other")}
        ).status == 201
        assert client.request("POST", "/v1/events", {"type": "t", "payload": 2}).status == 202
        assert client.request("GET", "/healthz").status == 200
        fake.wait_for("idle", "delivered_ids", 2, timeout=30)
        # Event 2 went to both destinations: three attempts in all.
        wait_until(lambda: _attempts(fault_dsn) == 3, 30, "the results recorded")
        records = [r for r in engine.events("database_recovered") if r["component"] == "worker"]
        assert all("record" not in r["failures"] for r in records), records
        assert not [r for r in engine.events("database_unavailable") if r["during"] == "record"]


def test_the_first_requests_after_an_outage_ingress_saw_are_served(
    owned_server: EmbeddedServer, fault_dsn: str, tmp_path: Path
) -> None:
    """Ingress knows of the outage (its key ring reads the database every 250 ms): the
    first requests once the server is back are served, not refused until the prober's next
    turn (engine/ingress/dbgate.py)."""
    with Engine(fault_dsn, tmp_path, "--procs", "1", "--bind", "127.0.0.1:0") as engine:
        [started] = wait_until(lambda: engine.events("supervisor_started"), 30, "supervisor")
        client = IngressProcess(fault_dsn)
        client.port = int(started["bind"].rsplit(":", 1)[1])
        wait_until(lambda: _answers(client, "/healthz") == 200, 30, "ingress")
        owned_server.control("-m", "fast", "-w", "-t", "60", "stop")
        wait_until(lambda: [r for r in engine.events("database_unavailable")
                            if r["component"] == "ingress"], 10, "ingress to see the outage")
        owned_server.control("-w", "-t", "60", *_server_log(owned_server), "start")
        assert client.request("GET", "/v1/deliveries?limit=1").status == 200
        assert client.request("POST", "/v1/events", {"type": "t", "payload": 1}).status == 202


def test_ingress_started_without_a_database_refuses_at_once() -> None:
    """No database from the start: 503 from the first request on, without a pool wait."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens on it once closed
    with IngressProcess(f"postgresql://postgres@127.0.0.1:{port}/postgres") as server:
        for path in ("/healthz", "/v1/deliveries", "/v1/destinations"):
            started = time.monotonic()
            answer = server.request("GET", path)
            assert answer.status == 503, answer
            assert time.monotonic() - started < POOL_TIMEOUT_S
        started = time.monotonic()
        answer = server.request("POST", "/v1/events", {"type": "t", "payload": 1})
        assert answer.status == 503, answer
        assert time.monotonic() - started < POOL_TIMEOUT_S

"""Soak: a real `engine` delivering to every hostile destination at once beside healthy
ones. 60 s by default (CI); ENGINE_SOAK_S=600 for the 10-minute run.

Ends with: no worker exited, nothing lost (every healthy delivery delivered, every
hostile one still in the queue with its failed attempts recorded, nothing left in
flight after the drain), no duplicate beyond the requests a rebuilt HTTP client had in
flight, every hostile destination's attempts failed with its own clear error, worker
memory bounded, and the healthy destinations answered in far less than the hostile
timeout (they never waited behind a hostile request)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import psycopg
import pytest

from engine.db.queue import EventIn
from engine.testing.fakedest import FakeDestination
from tests.kit import queue_sync
from tests.kit.data import add_destination
from tests.kit.enginerun import Engine, wait_until
from tests.kit.hostile_servers import HostileServer, TlsServer
from tests.kit.httpserver_helpers import closed_port
from tests.test_hostile_destinations import isolated_dns_prefix

SOAK_S = float(os.environ.get("ENGINE_SOAK_S", "60"))
BASELINE_S = 10  # healthy traffic alone first: what latency "unaffected" compares with
HOSTILE_TIMEOUT_MS = 1500
HOSTILE_DELIVERIES = 4  # per hostile destination, retried for the whole soak
HEALTHY_EVENTS_PER_S = 40
RSS_LIMIT = 300 * 1024 * 1024  # per worker; one 100 MB body kept would break it

# Destination name -> the error its attempts must all show.
HOSTILE_ERRORS = {
    "reset-headers": {"recv"},
    "reset-body": {"recv"},
    "garbage": {"invalid_response"},
    "http09": {"invalid_response"},
    "drip": {"timeout"},
    "hang": {"timeout"},
    "huge": {"HTTP 500"},
    "redirect": {"HTTP 302"},
    "refused": {"connect_refused"},
    "tls": {"tls"},
    "invalid": {"dns"},
}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) to keep DNS on loopback")
def test_hostile_soak(dsn: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    config = tmp_path / "engine.toml"
    # Breakers would pause the hostile destinations after a few failures; the soak wants
    # them hammered for its whole length.
    config.write_text("breaker_threshold = 1000000\n")
    schedule = ",".join(["400ms"] * 1000)
    # The healthy destinations are the Node fake (a process of its own), so that their
    # latency is the engine's, not that of a Python server sharing its GIL with the
    # hostile ones.
    with HostileServer() as hostile, TlsServer(tmp_path) as tls, FakeDestination() as fake:
        urls = {name: hostile.url(name) for name in HOSTILE_ERRORS
                if name not in ("refused", "tls", "invalid")}
        urls |= {"refused": f"http://127.0.0.1:{closed_port()}/hook", "tls": tls.url(),
                 "invalid": "http://nothing-here.invalid/hook"}
        hostile_ids = {
            add_destination(conn, url=url, event_types=["hostile"],
                            timeout_ms=HOSTILE_TIMEOUT_MS): name
            for name, url in urls.items()}
        healthy_names = ["healthy0", "healthy1"]
        healthy_ids = [add_destination(conn, url=fake.url(f"fast/{name}"), event_types=["tick"])
                       for name in healthy_names]
        engine = Engine(dsn, tmp_path, "--config", str(config), "--procs", "2",
                        "--bind", "127.0.0.1:0", "--allow-private-targets",
                        "--retry-schedule", schedule)
        engine.argv = [*isolated_dns_prefix(tmp_path), *engine.argv]
        with engine:
            wait_until(lambda: len(engine.events("child_started")) >= 4, 60, "children")
            workers = engine.worker_pids()
            healthy_events = 0
            rss_peak = 0
            begun = time.monotonic()
            hostile_from = None  # database time the hostile deliveries were enqueued
            while time.monotonic() - begun < BASELINE_S + SOAK_S:
                if hostile_from is None and time.monotonic() - begun >= BASELINE_S:
                    hostile_from = one(conn, "SELECT now()")
                    queue_sync.enqueue_events(conn, [EventIn("hostile", '{"h":1}')]
                                         * HOSTILE_DELIVERIES)
                queue_sync.enqueue_events(conn, [EventIn("tick", f'{{"n":{healthy_events}}}')
                                            for _ in range(HEALTHY_EVENTS_PER_S // 10)])
                healthy_events += HEALTHY_EVENTS_PER_S // 10
                # A worker that exits fails the soak with its exit ("worker 1687 exited:
                # SIGABRT after 25.3 s"), whether its log line or its absence comes first.
                engine.assert_no_worker_exited()
                rss_peak = max(rss_peak, *engine.sample_workers(
                    workers, lambda process: process.memory_info().rss))
                time.sleep(0.1)
            expected = healthy_events * len(healthy_ids)
            wait_until(lambda: engine.assert_no_worker_exited()
                       or finished(conn, healthy_ids) == expected, 60, "every healthy delivery")
            engine.assert_no_worker_exited()
            assert engine.worker_pids() == workers
            assert not engine.events("child_exited")
            assert not engine.events("child_restarted")
            # Faults of the client's machinery: none (issue 37, docs/decisions/0020-*.md).
            assert not engine.events("http_client_fault"), engine.events("http_client_fault")
            rebuilt = sum(r["failed_transfers"] for r in engine.events("http_client_rebuilt"))
        # After the drain: nothing in flight, nothing lost.
        rows = conn.execute(
            "SELECT status::text, count(*) FROM deliveries GROUP BY 1").fetchall()
        assert "in_flight" not in dict(rows), rows
        total = conn.execute("SELECT (SELECT count(*) FROM deliveries)"
                             " + (SELECT count(*) FROM finished_deliveries)").fetchone()
        assert total is not None
        assert total[0] == expected + HOSTILE_DELIVERIES * len(hostile_ids)
        stats = [fake.name_stats(name) for name in healthy_names]
        duplicates = sum(s["duplicates"] for s in stats)
        assert [s["delivered_ids"] for s in stats] == [healthy_events] * 2  # all arrived
        assert duplicates <= rebuilt, (duplicates, rebuilt)
        errors = conn.execute(
            "SELECT d.destination_id, a.error, count(*) FROM delivery_attempts a"
            " JOIN deliveries d ON d.id = a.delivery_id GROUP BY 1, 2").fetchall()
        seen: dict[str, set[str]] = {}
        for destination_id, error, _ in errors:
            if destination_id in hostile_ids:
                seen.setdefault(hostile_ids[destination_id], set()).add(error)
        for name, expected_errors in HOSTILE_ERRORS.items():
            # "worker exited" / "lease expired" would mean a lost attempt: none allowed. A
            # timeout is: on a starved CPU the test's own server may misbehave too late.
            found = seen.get(name, set())
            assert found & expected_errors and found <= expected_errors | {"timeout"}, (
                name, found)
        # Every healthy delivery succeeded at its first attempt: none waited behind a
        # hostile request until it timed out.
        assert one(conn, "SELECT max(attempt) FROM finished_deliveries"
                         " WHERE destination_id = ANY(%s)", healthy_ids) == 1
        # Latency against the same run's healthy-only phase, not against a number: the
        # machine's load decides absolute times. Medians, generously bounded: a healthy
        # request queued behind hostile ones would take the hostile timeout (1.5 s).
        before, during = (float(one(  # type: ignore[arg-type]
            conn, "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY a.duration_ms)"
            " FROM delivery_attempts a JOIN finished_deliveries f ON f.id = a.delivery_id"
            f" WHERE f.destination_id = ANY(%s) AND a.started_at {op} %s",
            healthy_ids, hostile_from)) for op in ("<", ">="))
        assert during < 3 * before + HOSTILE_TIMEOUT_MS / 5, (before, during)
        assert rss_peak < RSS_LIMIT, rss_peak
        print(f"soak {SOAK_S:.0f}s: {healthy_events} healthy events, duplicates {duplicates},"
              f" rebuilt transfers {rebuilt}, healthy median ms {before:.1f} alone,"
              f" {during:.1f} beside the hostile ones, worker RSS peak {rss_peak >> 20} MiB")


def one(conn: psycopg.Connection, query: str, *params: object) -> object:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def finished(conn: psycopg.Connection, destination_ids: list[int]) -> int:
    row = conn.execute("SELECT count(*) FROM finished_deliveries WHERE destination_id = ANY(%s)"
                       " AND status = 'delivered'", [destination_ids]).fetchone()
    return int(row[0]) if row else 0


def test_an_exited_worker_fails_the_sampling_with_its_signal(dsn: str, tmp_path: Path) -> None:
    """What the soak says when a worker dies under it: the worker and its signal, from the
    supervisor's log, not psutil's NoSuchProcess."""
    with Engine(dsn, tmp_path, "--procs", "1", "--bind", "127.0.0.1:0") as engine:
        (worker,) = wait_until(engine.worker_pids, 60, "the worker")
        os.kill(worker, signal.SIGABRT)
        with pytest.raises(AssertionError, match=rf"^worker {worker} exited: SIGABRT after "):
            for _ in range(600):
                engine.sample_workers([worker], lambda process: process.memory_info().rss)
                time.sleep(0.05)
        wait_until(lambda: engine.worker_exits(), 10, "the exit logged")
        with pytest.raises(AssertionError, match=rf"^worker {worker} exited: SIGABRT after "):
            engine.assert_no_worker_exited()

"""max_in_flight end to end on the engine's own workers: `engine --procs 3` (three worker
processes claiming at once) against a capped, slow destination with a backlog. What is
checked is what the README promises, measured where it matters, at the destination: the
most requests it had open at one time is exactly the cap (never more, and reached, so the
cap is what bound), and every delivery arrived once.

Each worker sends at most PER_WORKER requests at a time, fewer than the cap: the cap is
reached only with requests of two processes open together, so it binds across processes
(with more slots, one worker takes the destination's whole cap and keeps it busy with its
spares, and the others never send to it).

The same on several hosts (network namespaces): tests/test_netns_hosts.py.
"""

from __future__ import annotations

from pathlib import Path

import psycopg

from engine.testing.fakedest import FakeDestination
from tests.kit.data import add_destination, count, enqueue, finished
from tests.kit.enginerun import wait_until
from tests.kit.workers import engine

CAP = 5
ANSWER_MS = 250  # slow enough that five requests are open together, fast enough to drain
TOTAL = 150  # 7.5 s at the cap
BUSY = 300  # fast deliveries elsewhere, so that every worker claims meanwhile
PER_WORKER = 3  # --max-in-flight: less than the cap


def holders(conn: psycopg.Connection, destination: int) -> set[str]:
    rows = conn.execute("SELECT DISTINCT locked_by FROM deliveries WHERE destination_id = %s"
                        " AND status = 'in_flight'", [destination]).fetchall()
    return {str(row[0]) for row in rows}


def test_cap_is_exact_across_worker_processes(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    with FakeDestination() as fake, FakeDestination() as other:
        capped = add_destination(conn, url=fake.url(f"slow/{ANSWER_MS}/capped"),
                                 max_in_flight=CAP)
        busy = add_destination(conn, url=other.url("fast/busy"))
        seen: set[str] = set()
        with engine(dsn, tmp_path, config, "--procs", "3",
                    "--max-in-flight", str(PER_WORKER)) as run:
            wait_until(lambda: len(run.worker_pids()) == 3, 60, "three workers started")
            with conn.transaction():
                enqueue(conn, [f'{{"n": {i}}}' for i in range(TOTAL)], [capped])
                enqueue(conn, [f'{{"n": {i}}}' for i in range(BUSY)], [busy])

            def drained() -> bool:
                seen.update(holders(conn, capped))
                return finished(conn, capped) == TOTAL

            wait_until(drained, 120, f"{TOTAL} capped deliveries delivered")
        stats = fake.name_stats("capped")
        # Still open at the end: none (a request open past its result would be a leak).
        assert stats["in_flight"] == 0, stats
    assert stats["max_concurrent"] <= CAP, f"the cap of {CAP} was exceeded: {stats}"
    assert stats["max_concurrent"] == CAP, f"the cap of {CAP} was never reached: {stats}"
    assert (stats["delivered_ids"], stats["duplicates"]) == (TOTAL, 0), stats
    assert count(conn, "SELECT count(*) FROM deliveries WHERE destination_id = %s",
                 capped) == 0
    # Several processes held the destination's claims (reaching the cap needs two).
    assert len(seen) >= 2, f"only {seen} held the capped destination's claims"
    print(f"max concurrent {stats['max_concurrent']}, claim holders {sorted(seen)}")

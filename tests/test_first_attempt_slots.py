"""Retries cannot starve first attempts, on a real worker process (README, Delivery
semantics: "a quarter of each worker's slots is kept for them"). The rule is the claim's
(engine/sql/claim/claim_batch.sql, engine/worker/loop.py): each claim of `limit` free slots keeps
int(first_attempt_share x limit) of them (first_attempt_share = 0.25) for first attempts
when there are any; retries take at most the rest. tests/test_claim_properties.py checks
the statement alone; here `engine --procs 1` has a backlog of due retries to a slow
destination filling its slots when new events arrive for another one, and both are
measured at the fake destination."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from engine.testing.fakedest import FakeDestination
from tests.kit import workers
from tests.kit.data import add_destination, enqueue
from tests.kit.enginerun import wait_until

SLOTS = 32  # --max-in-flight of the one worker
# Due retries: the worker sends about SLOTS / 0.2 s of them a second, so this many last
# far longer than the first attempts need, whatever the machine's speed.
RETRIES = 3000
FIRST_ATTEMPTS = 100
# Answers in 150-250 ms: slow enough that retries hold every slot they get, fast and
# steady enough that the slow-endpoint limits (claim_policy.py: no answer for 0.5 s, or
# answers taking 2 s) never keep the retries to a share of the slots.
RETRY_PATH = "random/150/250/retries"
DEADLINE_S = 120.0


def test_first_attempts_are_sent_while_retries_fill_the_other_slots(
    dsn: str, conn: psycopg.Connection, tmp_path: Path, config: Path
) -> None:
    with FakeDestination() as fake:
        retrying = add_destination(conn, url=fake.url(RETRY_PATH))
        fresh = add_destination(conn, url=fake.url("fast/fresh"))
        enqueue(conn, [f'{{"retry": {n}}}' for n in range(RETRIES)], [retrying])
        # Each has failed once already and is due again now.
        conn.execute(
            "UPDATE deliveries SET attempt = 1, next_attempt_at = now() - interval '1 minute'"
            " WHERE destination_id = %s", [retrying])
        with workers.engine(dsn, tmp_path, config, "--procs", "1",
                            "--max-in-flight", str(SLOTS)) as engine:
            wait_until(lambda: engine.worker_pids(), 30, "the worker to start")
            # The retries hold (nearly) every slot before any first attempt exists.
            wait_until(lambda: _in_flight(fake, "retries") >= SLOTS - 2, 30,
                       "retries to fill the worker's slots")
            enqueue(conn, [f'{{"first": {n}}}' for n in range(FIRST_ATTEMPTS)], [fresh])

            retries_in_flight: list[int] = []
            deadline = time.monotonic() + DEADLINE_S
            while True:
                stats = fake.stats()["names"]
                first_sent = stats.get("fresh", {}).get("delivered_ids", 0)
                retries_sent = stats["retries"]["delivered_ids"]
                if first_sent >= FIRST_ATTEMPTS or retries_sent >= RETRIES // 2:
                    break
                retries_in_flight.append(stats["retries"]["in_flight"])
                assert time.monotonic() < deadline, (
                    f"after {DEADLINE_S} s: {first_sent} first attempts, {retries_sent} retries")
                time.sleep(0.05)
            pending_retries = conn.execute(
                "SELECT count(*) FROM deliveries WHERE destination_id = %s",
                [retrying]).fetchone()

    summary = (f"{first_sent}/{FIRST_ATTEMPTS} first attempts sent beside {retries_sent} "
               f"retries in {len(retries_in_flight)} samples; retries in flight: "
               f"max {max(retries_in_flight, default=0)}, "
               f"median {sorted(retries_in_flight)[len(retries_in_flight) // 2:][:1]}")
    print(f"\n{summary}")
    # Every first attempt went out while the retry backlog was far from drained: they did
    # not wait behind it.
    assert first_sent == FIRST_ATTEMPTS, summary
    assert retries_sent < RETRIES // 2, summary
    assert pending_retries is not None and pending_retries[0] > RETRIES // 2, summary
    # And the retries kept the rest of the slots meanwhile: at least three quarters.
    assert retries_in_flight and max(retries_in_flight) >= SLOTS * 3 // 4, summary


def _in_flight(fake: FakeDestination, name: str) -> int:
    in_flight: int = fake.name_stats(name).get("in_flight", 0)
    return in_flight

"""End to end through `engine`: a destination dies and recovers while another keeps its
pace; the breaker opens, probes and closes; /metrics agrees with the database."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from engine.db.queue import EventIn
from engine.testing.fakedest import FakeDestination
from engine.testing.ingress_server import IngressProcess
from tests.kit import queue_sync
from tests.kit.data import add_destination
from tests.kit.enginerun import Engine, wait_until

FEED_INTERVAL_S = 0.05
# The dying destination answers 500 from OUTAGE_START_S after the feed starts, for at
# least OUTAGE_MIN_S and until a probe has failed (the breaker's doubled pause is seen):
# ended on that event, not on the clock, so a starved engine that opens its breaker late
# still shows a failed probe. The feed goes on FEED_AFTER_S past the outage.
OUTAGE_START_S = 2.0
OUTAGE_MIN_S = 4.0
OUTAGE_GUARD_S = 120.0  # a breaker that never probes: end anyway, the assertions fail
FEED_AFTER_S = 3.0


def one(conn: psycopg.Connection, query: str, *params: object) -> object:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def scrape(client: IngressProcess) -> dict[tuple[str, tuple], float]:
    found = {}
    text = client.request("GET", "/metrics").body.decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_dead_destination_recovers_and_the_other_keeps_pace(
    dsn: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    config = tmp_path / "engine.toml"
    config.write_text("breaker_threshold = 3\nbreaker_base_pause_ms = 1000\n"
                      "breaker_max_pause_ms = 2000\n")
    with FakeDestination() as fake, Engine(
        dsn, tmp_path, "--config", str(config), "--procs", "2", "--bind", "127.0.0.1:0",
        "--allow-private-targets", "--retry-schedule", ",".join(["300ms"] * 30),
    ) as engine:
        dying = add_destination(conn, url=fake.url("toggle/dying"))
        steady = add_destination(conn, url=fake.url("fast/steady"))
        [started] = wait_until(lambda: engine.events("supervisor_started"), 30, "supervisor")
        client = IngressProcess(dsn)
        client.port = int(started["bind"].rsplit(":", 1)[1])
        wait_until(lambda: len(engine.events("child_started")) >= 4, 30, "children")

        states: set[tuple[str, int]] = set()
        stop = threading.Event()

        def watch() -> None:
            with psycopg.connect(dsn, autocommit=True) as own:
                while not stop.is_set():
                    row = own.execute("SELECT breaker::text, breaker_pause_ms FROM"
                                      " destinations WHERE id = %s", [dying]).fetchone()
                    assert row is not None
                    states.add(row)
                    time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        event_ids: list[int] = []
        begun = time.monotonic()
        outage = "before"
        outage_began = outage_ended = 0.0
        while outage != "after" or time.monotonic() - outage_ended < FEED_AFTER_S:
            now = time.monotonic()
            if outage == "before" and now - begun >= OUTAGE_START_S:
                fake.control("dying", "fail", 500)
                outage, outage_began = "during", now
            elif outage == "during" and now - outage_began >= OUTAGE_MIN_S and (
                    ("open", 2000) in states or now - outage_began >= OUTAGE_GUARD_S):
                fake.control("dying", "ok")
                outage, outage_ended = "after", now
            with conn.transaction():
                [(event_id, _)] = queue_sync.enqueue_events(
                    conn, [EventIn("t", "{}", [dying, steady])])
            assert event_id is not None
            event_ids.append(event_id)
            time.sleep(FEED_INTERVAL_S)
        wait_until(lambda: one(conn, "SELECT count(*) FROM deliveries") == 0, 30,
                   "every delivery finished")
        stop.set()
        watcher.join()

        # The breaker opened, a probe failed (only that doubles the pause), and it closed
        # once the destination answered again.
        assert ("open", 1000) in states and ("open", 2000) in states, states
        assert one(conn, "SELECT breaker::text FROM destinations WHERE id = %s",
                   dying) == "closed"
        assert one(conn, "SELECT count(*) FROM finished_deliveries WHERE destination_id = %s"
                         " AND status = 'delivered'", dying) == len(event_ids)
        # Without the breaker every event of the outage (4 s or more: 80 or more) would fail
        # at least once; with it: the threshold, what was in flight, one probe per pause.
        failed = one(conn, "SELECT count(*) FROM delivery_attempts a JOIN finished_deliveries f"
                           " ON f.id = a.delivery_id WHERE f.destination_id = %s"
                           " AND a.status_code = 500", dying)
        assert 3 <= failed < 40, failed

        # The steady destination kept its pace: none of its deliveries waited.
        arrivals = fake.arrivals("steady")
        created = dict(conn.execute(
            "SELECT id, (extract(epoch FROM created_at) * 1000)::bigint FROM events").fetchall())
        waits = [arrivals[f"evt_{e}"] - created[e] for e in event_ids]
        assert len(waits) == len(event_ids) and max(waits) < 2000, max(waits)

        # /metrics (summed over both workers) says what the database says.
        found = scrape(client)
        delivered = one(conn, "SELECT count(*) FROM finished_deliveries"
                              " WHERE status = 'delivered'")
        retried = one(conn, "SELECT count(*) FROM delivery_attempts WHERE status_code = 500")
        assert found[("engine_deliveries_total", (("outcome", "delivered"),))] == delivered
        assert found[("engine_deliveries_total", (("outcome", "retry"),))] == retried
        assert found[("engine_attempt_duration_seconds_count",
                      (("outcome", "delivered"),))] == delivered
        assert found[("engine_queue_depth", (("status", "pending"),))] == 0
        assert found[("engine_destinations_breaker", (("state", "closed"),))] == 2
        claimed = one(conn, "SELECT count(*) FROM delivery_attempts")
        assert found[("engine_claim_batch_size_sum", ())] == claimed
        assert found[("engine_in_flight", ())] == 0

        # The supervisor's maintenance child led the whole time and let go on the drain.
        assert len(engine.events("leader_acquired")) == 1

        engine.signal(signal.SIGTERM)
        assert engine.wait(40) == 0
        assert len(engine.events("leader_released")) == 1


CAPACITY = 64
SHARE = CAPACITY // 8  # engine/worker/claim_policy.py SLOW_SHARE


def one_worker(dsn: str, tmp_path: Path, *extra: str) -> Engine:
    """An engine with one worker of CAPACITY slots."""
    return Engine(dsn, tmp_path, "--procs", "1", "--max-in-flight", str(CAPACITY),
                  "--bind", "127.0.0.1:0", "--allow-private-targets", "--drain-deadline", "1",
                  *extra)


def enqueue_a_share_then_a_mix(
    conn: psycopg.Connection, troubled: int, healthy: int, then: int,
) -> None:
    """First `SHARE` deliveries to `troubled` and the rest of the worker's slots' worth to
    `healthy` (this transaction's rows are due first), then `then` more with every fifth
    to `troubled`."""
    first = [troubled] * SHARE + [healthy] * (CAPACITY - SHARE)
    rest = [troubled if i % 5 == 4 else healthy for i in range(then)]
    for targets in (first, rest):
        with conn.transaction():
            queue_sync.enqueue_events(conn, [EventIn("t", "{}", [t]) for t in targets])


def test_a_hanging_endpoint_cannot_take_the_healthy_slots(
    dsn: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    """Before the breaker can open (its failures take a whole timeout to come), a worker
    stops claiming for an endpoint whose requests pile up unanswered once they hold its
    share of the slots (an eighth), so the healthy backlog drains long before the first of
    the hanging requests times out."""
    with FakeDestination(extra_args=["--keep", "0"]) as fake, one_worker(
        dsn, tmp_path,
        # Hanging requests that time out only after two minutes: room for a starved
        # machine to drain the healthy backlog before the first of them does.
        "--max-timeout", "120s", "--lease", "200s",
    ) as engine:
        hanging = add_destination(conn, url=fake.url("dead/hanging"), timeout_ms=120_000)
        healthy = add_destination(conn, url=fake.url("slow/20/healthy"))
        # The worker's first claim fills every slot before anything is known about either
        # destination: it gets exactly `SHARE` hanging deliveries (this transaction's rows
        # are due first). From then on the hanging endpoint must get no more slots while
        # healthy deliveries wait, and far more of them wait than the test lets drain.
        enqueue_a_share_then_a_mix(conn, hanging, healthy, 5000)
        wait_until(lambda: fake.name_stats("healthy").get("delivered_ids", 0) >= 2000, 110,
                   "the healthy backlog, within the hanging requests' timeout")
        stats = fake.name_stats("hanging")
        assert stats["max_concurrent"] == SHARE, stats
        assert stats["requests"] == SHARE, stats
        engine.signal(signal.SIGTERM)
        assert engine.wait(40) == 0


def test_a_slow_but_answering_endpoint_keeps_to_its_share_of_the_slots(
    dsn: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    """An endpoint that answers, but only after seconds, is never silent once its answers
    come in; still, while healthy deliveries wait, it holds no more than its share of the
    slots: the deliveries that piled up for it while it held its share, claimed the moment
    one of its slots came back, are given back instead of taking every free slot."""
    with FakeDestination(extra_args=["--keep", "0"]) as fake, one_worker(
        dsn, tmp_path
    ) as engine:
        slow = add_destination(conn, url=fake.url("slow/3000/slow"), timeout_ms=30_000)
        # 50 ms: the healthy backlog lasts well past two slow rounds on a fast machine too.
        healthy = add_destination(conn, url=fake.url("slow/50/healthy"))
        # The first claim knows neither: it gets exactly `SHARE` slow deliveries. Then far
        # more healthy ones wait than the test lets drain, and a slow one every fifth.
        enqueue_a_share_then_a_mix(conn, slow, healthy, 20_000)
        # Two rounds of slow answers: after the first, the endpoint is known to be slow.
        wait_until(lambda: fake.name_stats("slow").get("delivered_ids", 0) >= 2 * SHARE, 120,
                   "two rounds of answers from the slow endpoint")
        assert fake.name_stats("healthy").get("delivered_ids", 0) < 16_000, \
            "the healthy backlog ran out: the test proves nothing"
        stats = fake.name_stats("slow")
        assert stats["max_concurrent"] <= SHARE, stats
        engine.signal(signal.SIGTERM)
        assert engine.wait(40) == 0

"""Delivery workers and the supervisor as real processes, POSTing over loopback to the fake
destination (engine/testing/fakedest.mjs), signatures checked by the independent `standardwebhooks`
package."""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import time
from pathlib import Path

import psutil
import psycopg
import uvloop
from standardwebhooks import Webhook

from engine.config import load_settings
from engine.db.queue import Claim
from engine.testing.fakedest import FakeDestination
from engine.webhooks.signing import generate_secret
from engine.worker import DeliveryWorker, outcome
from engine.worker.dispatcher import SPARES_PER_SLOT
from engine.worker.egress import EgressSide
from engine.worker.http.pools import CurlPools
from engine.worker.http.transfer import HttpResult
from engine.worker.recorder import FLUSH_INTERVAL_S, SLOT_FLUSH_INTERVAL_S
from engine.worker.slots import DestinationSlots
from tests.kit.data import add_destination, count, enqueue, finished
from tests.kit.enginerun import Engine, wait_until
from tests.kit.workers import MAX_ATTEMPTS, SCHEDULE, engine


def test_delivers_signed_through_fast_slow_flaky_and_dead_destinations(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    secret, old_secret = generate_secret(), generate_secret()
    with FakeDestination(secrets=[secret]) as fake:
        fast = add_destination(conn, url=fake.url("fast/fast"), secret=secret)
        slow = add_destination(conn, url=fake.url("slow/300/slow"), secret=secret)
        flaky = add_destination(conn, url=fake.url("flaky/30/flaky"), secret=secret)
        dead = add_destination(conn, url=fake.url("dead/dead"), secret=secret, timeout_ms=300)
        rotated = add_destination(
            conn, url=fake.url("fast/rotated"), secret=secret, previous_secret=old_secret,
            previous_secret_until=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
        )
        # Bytes a re-encoding would change: spacing, key order, escapes, non-ASCII.
        odd = '{"b" :  1, "a":"caf\\u00e9 ☕",\n "n": 1.50}'
        payloads = [odd] + [f'{{"n": {i}}}' for i in range(39)]
        event_ids = enqueue(conn, payloads, [fast, slow, flaky])
        enqueue(conn, payloads[:3], [dead])
        (rotated_event,) = enqueue(conn, [odd], [rotated])

        with engine(dsn, tmp_path, config, "--procs", "2"):
            for destination in (fast, slow, flaky):
                wait_until(lambda d=destination: finished(conn, d) == 40, 30,
                           f"40 delivered to destination {destination}")
            wait_until(lambda: finished(conn, dead, "dead") == 3, 30, "dead deliveries")
            wait_until(lambda: finished(conn, rotated) == 1, 30, "rotated delivered")

        for name in ("fast", "slow", "flaky", "rotated"):
            stats = fake.name_stats(name)
            assert stats["sig_bad"] == 0 and stats["sig_ok"] == stats["requests"], stats
        flaky_stats = fake.name_stats("flaky")
        assert flaky_stats["requests"] > 40  # some attempts failed and were retried
        assert flaky_stats["delivered_ids"] == 40

        # Independent verification of what arrived: signature, id and body bytes.
        verifier = Webhook(secret)
        by_id: dict[str, set[bytes]] = {}
        for name in ("fast", "slow", "flaky"):
            for request in fake.requests(name):
                headers = request["headers"]
                verifier.verify(request["body"], headers)
                by_id.setdefault(headers["webhook-id"], set()).add(request["body"])
                assert headers["content-type"] == "application/json"
                assert headers["user-agent"].startswith("engine/")
        # The webhook-id names the event: the same for every destination and retry.
        first = f"evt_{event_ids[0]}"
        assert by_id[first] == {odd.encode()}
        assert {f"evt_{e}" for e in event_ids} >= set(by_id)
        # Retried, yet one webhook-id per event: the id did not change between attempts.
        assert flaky_stats["distinct_ids"] == 40

        # During rotation both secrets sign; each alone verifies.
        (request,) = fake.requests("rotated")
        assert len(request["headers"]["webhook-signature"].split(" ")) == 2
        for key in (secret, old_secret):
            Webhook(key).verify(request["body"], request["headers"])
        assert request["headers"]["webhook-id"] == f"evt_{rotated_event}"
        assert request["body"] == odd.encode()

    # History: every attempt of the dead destination timed out and the last error is kept.
    rows = conn.execute(
        "SELECT a.error, a.status_code FROM delivery_attempts a"
        " JOIN finished_deliveries f ON f.id = a.delivery_id WHERE f.destination_id = %s",
        [dead],
    ).fetchall()
    assert len(rows) == 3 * MAX_ATTEMPTS
    assert {error for error, _ in rows} == {"timeout"}
    assert count(conn, "SELECT count(*) FROM finished_deliveries WHERE destination_id = %s"
                 " AND last_error = 'timeout'", dead) == 3
    assert count(conn, "SELECT count(*) FROM deliveries") == 0


def test_outcomes_410_429_and_exhausted_attempts(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    with FakeDestination() as fake:
        gone = add_destination(conn, url=fake.url("status/410/gone"))
        limited = add_destination(conn, url=fake.url("429/600/limited"))
        spent = add_destination(conn, url=fake.url("fast/spent"))
        enqueue(conn, ["{}"], [gone, limited])
        enqueue(conn, ["{}"], [spent])
        # Lost attempts (dead workers) used every attempt up: the next claim must not send.
        conn.execute("UPDATE deliveries SET attempt = %s WHERE destination_id = %s",
                     [MAX_ATTEMPTS, spent])
        with engine(dsn, tmp_path, config, "--procs", "1"):
            wait_until(lambda: finished(conn, spent, "dead") == 1, 60, "exhausted -> dead")
            wait_until(lambda: count(conn, "SELECT count(*) FROM delivery_attempts") >= 2, 60,
                       "attempts recorded")
            wait_until(lambda: count(
                conn, "SELECT count(*) FROM deliveries WHERE status = 'pending'") == 2, 60,
                "both back to pending")
        assert fake.name_stats("spent") == {}
        assert fake.name_stats("limited")["requests"] == 1  # Retry-After: 600 s, not 200 ms

    disabled, reason = conn.execute(
        "SELECT disabled, disabled_reason FROM destinations WHERE id = %s", [gone]).fetchone()
    assert disabled and "410" in reason
    # Retry-After honoured over 200 ms: counted from the attempt, however long ago it was.
    waits = dict(conn.execute(
        "SELECT d.destination_id, d.next_attempt_at - a.started_at FROM deliveries d"
        " JOIN delivery_attempts a ON a.delivery_id = d.id").fetchall())
    assert waits[limited] >= dt.timedelta(seconds=600)
    assert count(conn, "SELECT count(*) FROM finished_deliveries WHERE destination_id = %s"
                 " AND last_error = 'attempts exhausted'", spent) == 1


def test_kill_9_of_a_worker_loses_nothing_and_resends_only_what_was_in_flight(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    total = 200
    with FakeDestination() as fake:
        slow = add_destination(conn, url=fake.url("slow/1000/k"))
        enqueue(conn, [f'{{"n": {i}}}' for i in range(total)], [slow])
        with engine(dsn, tmp_path, config, "--procs", "1", "--max-in-flight", "60") as run:
            wait_until(lambda: fake.name_stats("k").get("in_flight", 0) >= 30, 60,
                       "requests in flight")
            (victim,) = run.worker_pids()
            run.sample_workers([victim], psutil.Process.kill)  # gone already: says how
            wait_until(lambda: run.events("claims_released"), 60, "claims released")
            wait_until(lambda: len(run.worker_pids()) == 1 and run.worker_pids() != [victim],
                       60, "worker restarted")
            wait_until(lambda: finished(conn, slow) == total, 120, "everything delivered")
        (released,) = run.events("claims_released")
        assert released["worker"].endswith(f":{victim}")
        stats = fake.name_stats("k")
    assert stats["delivered_ids"] == total
    assert 0 < released["count"] <= 2 * 60  # in flight, plus at most as many prefetched
    assert stats["duplicates"] <= released["count"]
    lost = count(conn, "SELECT count(*) FROM delivery_attempts WHERE error = 'worker exited'")
    assert lost == released["count"]
    assert count(conn, "SELECT count(*) FROM deliveries") == 0


def test_max_in_flight_bounds_the_requests_while_a_worker_prefetches(
    conn: psycopg.Connection, dsn: str
) -> None:
    """The worker in this process (real database, real HTTP), so that the test can see its
    prefetch: claims held in `ready` beyond the free slots while every slot is busy."""
    total, cap = 600, 20
    settings = load_settings(max_in_flight=cap, allow_private_targets=True,
                             retry_schedule=SCHEDULE, breaker_threshold=1000)

    async def deliver_all(worker: DeliveryWorker) -> int:
        running = asyncio.ensure_future(worker.run())
        most_ready = 0
        while worker.dispatcher.answered < total and not running.done():
            most_ready = max(most_ready, len(worker.dispatcher.ready))
            await asyncio.sleep(0.001)
        worker.begin_drain()
        await running  # records what was answered, and raises what the worker raised
        return most_ready

    with FakeDestination() as fake:
        # Answers come while a claim runs (so the worker prefetches), and every slot is
        # busy long enough for the destination to see them all at once.
        quick = add_destination(conn, url=fake.url("slow/50/m"))
        enqueue(conn, ["{}"] * total, [quick])
        most_ready = uvloop.run(deliver_all(DeliveryWorker(settings, dsn, "prefetch-test")))
        stats = fake.name_stats("m")
    assert most_ready > 0  # it did prefetch: claims waited for a slot
    assert stats["max_concurrent"] == cap  # every slot used, never one more
    assert (stats["delivered_ids"], stats["duplicates"]) == (total, 0)
    assert finished(conn, quick) == total


def test_sigterm_drains_and_a_second_signal_exits_at_once(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    with FakeDestination() as fake:
        slow = add_destination(conn, url=fake.url("slow/1500/s"))
        hanging = add_destination(conn, url=fake.url("dead/h"), timeout_ms=20_000)
        enqueue(conn, ["{}"] * 100, [slow])
        enqueue(conn, ["{}"] * 20, [hanging])
        # Room for all 120 at once, so slow and hanging requests are in flight together.
        with engine(dsn, tmp_path, config, "--procs", "2", "--max-in-flight", "100",
                    "--drain-deadline", "4") as run:
            wait_until(lambda: fake.name_stats("s").get("in_flight", 0) >= 20
                       and fake.name_stats("h").get("in_flight", 0) == 20, 20, "in flight")
            run.signal(signal.SIGTERM)
            assert run.wait(4 + 10) == 0
        assert [e["event"] for e in run.events() if e["event"].startswith("drain")] == [
            "drain_begun", "drain_finished"]
        answered = fake.name_stats("s")["delivered_ids"]
    # Answered requests were recorded; the hanging ones went back unsent-equivalent.
    assert count(conn, "SELECT count(*) FROM deliveries WHERE status = 'in_flight'") == 0
    assert finished(conn, slow) == answered
    assert count(conn, "SELECT count(*) FROM deliveries WHERE destination_id = %s"
                 " AND status = 'pending' AND attempt = 0", hanging) == 20

    # A second signal: no waiting for the hanging requests; their claims still go back.
    with FakeDestination() as fake:
        conn.execute("UPDATE destinations SET url = %s WHERE id = %s",
                     [fake.url("dead/h2"), hanging])
        with engine(dsn, tmp_path, config, "--procs", "1", "--drain-deadline", "60") as run:
            wait_until(lambda: fake.name_stats("h2").get("in_flight", 0) == 20, 20,
                       "hanging requests")
            run.signal(signal.SIGTERM)
            wait_until(lambda: run.events("drain_begun"), 5, "drain begun")
            run.signal(signal.SIGINT)
            assert run.wait(10) != 0
        assert run.events("exit_now")
    assert count(conn, "SELECT count(*) FROM deliveries WHERE status = 'in_flight'") == 0


def test_hanging_requests_hold_no_database_connections(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    procs = 2
    with FakeDestination() as fake:
        hanging = add_destination(conn, url=fake.url("dead/pg"), timeout_ms=25_000)
        enqueue(conn, ["{}"] * 300, [hanging])
        with engine(dsn, tmp_path, config, "--procs", str(procs), "--drain-deadline", "1"):
            wait_until(lambda: fake.name_stats("pg").get("in_flight", 0) == 300, 60,
                       "300 hanging requests")
            dbname = conn.info.dbname
            # A transaction held across the hanging requests is open for seconds; the
            # claim's own two statements may be caught between them on a starved machine.
            rows = conn.execute(
                "SELECT state, application_name, coalesce(now() - xact_start > '5 s', false)"
                " FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                [dbname],
            ).fetchall()
    worker_rows = [r for r in rows if r[1].startswith("engine worker")]
    assert 0 < len(worker_rows) <= procs * 2, rows  # the pools' bound, whatever is in flight
    assert all(name.startswith("engine") for _, name, _ in rows), rows
    assert not any(state == "idle in transaction" and old for state, _, old in rows), rows


def test_a_long_run_of_unsignable_ready_claims_each_fails_once() -> None:
    # A secret that cannot sign (written past the API's checks) fails the attempt without
    # any HTTP. Thousands of such claims waiting in `ready` behind a busy slot go out when
    # it frees: each must fail on its own, not by recursing into the next one.
    async def scenario() -> DeliveryWorker:
        worker = DeliveryWorker(load_settings(retry_schedule="1s"), "postgresql://unused")
        worker.recorder.loop = asyncio.get_running_loop()
        dispatcher = worker.dispatcher
        dispatcher.capacity = 1
        runs = 3000
        for i in range(runs):
            dispatcher.ready.append(
                (Claim(i, i, 1, 1, "http://127.0.0.1:9/", 1000, ["not-a-secret"], "{}"), 0.0))
        running = Claim(runs, runs, 1, 1, "http://127.0.0.1:9/", 1000, [], "{}")
        slots = dispatcher.destinations[1] = DestinationSlots()
        slots.started[running.id] = 0.0  # the one slot's request
        dispatcher.held, dispatcher.sending = runs + 1, 1
        dispatcher.request_ended(running)  # ...just answered
        dispatcher.finished(running)
        await asyncio.sleep(0.05)
        return worker

    worker = asyncio.run(scenario())
    dispatcher = worker.dispatcher
    assert (dispatcher.held, len(dispatcher.ready), dispatcher.sending) == (0, 0, 0)
    assert dispatcher.destinations == {}
    assert len(worker.recorder.results) == 3000
    assert all(r.outcome == "retry" and (r.error or "").startswith("signing: ")
               for r in worker.recorder.results)


def test_a_result_comes_in_while_the_pending_flush_is_a_plain_handle() -> None:
    """uvloop's call_at returns a plain Handle, with no when(), for a time less than half a
    millisecond ahead. The recorder gets one when the worker is preempted for 5 ms
    between computing a flush time and scheduling it (a loaded machine, 2026-12-02:
    every later result raised in the HTTP callback, and the slots it held never came
    back). Here that state is set up directly; the next results must still be added and
    flushed."""
    async def scenario() -> DeliveryWorker:
        worker = DeliveryWorker(load_settings(retry_schedule="1s"), "postgresql://unused")
        loop = worker.recorder.loop = asyncio.get_running_loop()
        recorder = worker.recorder
        recorder.flush_due = loop.time() - 0.001
        recorder.flush_timer = loop.call_at(recorder.flush_due, recorder.flush_wanted.set)
        assert not hasattr(recorder.flush_timer, "when")  # the premise
        for i in range(3):
            recorder.add(outcome.released(
                Claim(i, i, 1, 1, "http://127.0.0.1:9/", 1000, [], "{}")))
        await asyncio.wait_for(recorder.flush_wanted.wait(), 5)
        return worker

    worker = uvloop.run(scenario())
    assert [r.id for r in worker.recorder.results] == [0, 1, 2]


def test_a_lease_shorter_than_the_longest_request_is_refused(tmp_path: Path) -> None:
    run = Engine("postgresql://127.0.0.1:1/unused", tmp_path, "--lease", "20s",
                 "--max-timeout", "10s")
    with run:
        assert run.wait(30) == 2
    assert "lease" in run.log_path.read_text()


def test_children_drain_by_themselves_when_the_supervisor_is_killed(
    conn: psycopg.Connection, dsn: str, tmp_path: Path, config: Path
) -> None:
    with FakeDestination() as fake:
        slow = add_destination(conn, url=fake.url("slow/1000/o"))
        enqueue(conn, ["{}"] * 50, [slow])
        with engine(dsn, tmp_path, config, "--procs", "1", "--drain-deadline", "5") as run:
            wait_until(lambda: fake.name_stats("o").get("in_flight", 0) > 0, 20, "in flight")
            children = psutil.Process(run.pid).children()
            assert children
            psutil.Process(run.pid).kill()
            run.wait(5)
            _, alive = psutil.wait_procs(children, timeout=15)
            for child in alive:  # the test failed: do not leave them behind
                child.kill()
            assert not alive, alive
    assert count(conn, "SELECT count(*) FROM deliveries WHERE status = 'in_flight'") == 0
    assert finished(conn, slow) + count(conn, "SELECT count(*) FROM deliveries") == 50


def test_an_answer_that_hands_its_slot_to_a_spare_waits_for_the_usual_flush() -> None:
    """A success of a small cap's claim with a spare of its destination at hand starts the
    spare at once (a real POST, to a real fake destination) and names it in its result;
    the slot stays taken in the database, so the result waits for the usual flush instead
    of being written at once, and the write asks for SPARES_PER_SLOT x cap spares, less
    those held. Without a spare, the result gives its slot back and is flushed at once,
    for the write to refill the slot."""
    cap = 5

    def capped(i: int, url: str, **kw: bool) -> Claim:
        return Claim(i, i, 7, 1, url, 5000, [generate_secret()], "{}", max_in_flight=cap,
                     claim_token=100 + i, **kw)

    async def scenario(url: str) -> tuple[float, float]:
        worker = DeliveryWorker(
            load_settings(retry_schedule="1s", allow_private_targets=True), "postgresql://unused")
        loop = worker.loop = worker.recorder.loop = asyncio.get_running_loop()
        worker.room = asyncio.Event()
        worker.http_idle = asyncio.Event()
        worker.http = CurlPools(worker.capacity)
        worker.egress = EgressSide("postgresql://unused", worker.http, True, worker.lookup,
                                   None, None)
        dispatcher, recorder = worker.dispatcher, worker.recorder
        slots = dispatcher.destinations[7] = DestinationSlots()
        answered = HttpResult(200, b"{}", None, 100.0, None, 0.0)
        source, spare = capped(1, url, fills_cap=True, holds_slot=True), capped(2, url)
        slots.started[source.id] = time.monotonic()
        slots.spares.append((spare, time.monotonic()))
        dispatcher.held, dispatcher.sending = 2, 1
        worker._on_response(source, answered)
        handed_flush = recorder.flush_due - loop.time()
        assert dispatcher.handed_to == {spare.id} and list(slots.started) == [spare.id]
        assert recorder.results[-1].slot_to == spare.id
        assert recorder.slot_results == 0
        assert dispatcher.spares_wanted({7: cap}) == {7: SPARES_PER_SLOT * cap}
        # No spare left: the next success gives its slot back for the write to refill.
        other = capped(3, url, fills_cap=True, holds_slot=True)
        slots.started[other.id] = time.monotonic()
        dispatcher.held += 1
        dispatcher.sending += 1
        worker._on_response(other, answered)
        given_back_flush = recorder.flush_due - loop.time()
        assert recorder.refill == {7: 1} and recorder.slot_results == 1
        await asyncio.wait_for(worker.http_idle.wait(), 10)  # the spare's own answer
        await worker.http.close()
        return handed_flush, given_back_flush

    with FakeDestination() as fake:
        handed_flush, given_back_flush = uvloop.run(scenario(fake.url("fast/spares")))
        wait_until(lambda: fake.name_stats("spares").get("requests") == 1, 10, "the spare")
    assert FLUSH_INTERVAL_S / 2 < handed_flush <= FLUSH_INTERVAL_S + 1e-6
    assert given_back_flush <= SLOT_FLUSH_INTERVAL_S

"""max_in_flight with several concurrent claimers: the cap is never exceeded, and each
capped destination's slot counter equals the number of its in-flight deliveries holding a
slot after every step, whatever mix of claims, results, releases, reaps and slot refills
(a result write that claims the freed slots again, refill_slots.sql) runs at once. Some
claimers also hold spares (claims that take no slot) and hand a success's slot on to one
(record_results.sql, `handed`), as a worker does: the requests they have "running" for
a destination, counted across claimers, never exceed its cap.

Each claimer is a thread with its own connection, like a worker process; after each of its
steps it checks the invariants in one statement (one snapshot: a claim or result changes
the counter and the rows in one transaction), and so does a watcher thread in a loop.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import queue
from engine.maintenance.reaper import reap_expired
from engine.queue import BreakerSettings, EventIn, Result
from tests.kit.data import LEASE_MS, add_destination, now
from tests.kit.dbserver import truncate_all

pytestmark = pytest.mark.pg_versions

EXAMPLES = 40
MAX_ATTEMPTS = 4
OUTCOMES = ("delivered", "retry", "dead", "released", "reaped")
# Only a guard against a claimer that never finishes, not a timing claim: a plan of 140
# deliveries claimed one at a time with three releases in five took over 60 s with the
# suite running twice beside it (2026-12-01, tools/test-loaded.sh with CI alongside).
DEADLINE_S = 300.0
NO_BREAKER = BreakerSettings(threshold=1_000_000_000)

# Per capped destination, in one snapshot: its counter, the in-flight deliveries holding a
# slot, and its cap. (More rows than the cap may be in flight: spares hold no slot.)
CHECK = """
SELECT dest.id, dest.in_flight, dest.max_in_flight,
       count(d.id) FILTER (WHERE d.holds_slot) AS holding
  FROM destinations dest
  LEFT JOIN deliveries d ON d.destination_id = dest.id AND d.status = 'in_flight'
 WHERE dest.max_in_flight IS NOT NULL
 GROUP BY dest.id
"""


def violations(conn: psycopg.Connection) -> list[str]:
    found = []
    for dest, counter, cap, holding in conn.execute(CHECK).fetchall():
        if counter != holding:
            found.append(f"destination {dest}: counter {counter}, {holding} holding a slot")
        if holding > cap:
            found.append(f"destination {dest}: {holding} slots held over its cap {cap}")
    return found


class Running:
    """The requests the claimers have running per destination (a claim that holds a
    slot, from its claim to its answer; a spare, from the answer that handed it a slot to
    its own), checked against the caps at every start."""

    def __init__(self, caps: dict[int, int | None]) -> None:
        self.caps = caps
        self.lock = threading.Lock()
        self.count: dict[int, int] = {}

    def start(self, claim: queue.Claim, found: list[str]) -> None:
        cap = self.caps[claim.destination_id]
        if cap is None:
            return
        with self.lock:
            n = self.count[claim.destination_id] = self.count.get(claim.destination_id, 0) + 1
        if n > cap:
            found.append(f"destination {claim.destination_id}: {n} requests running"
                         f" over its cap {cap}")

    def end(self, claim: queue.Claim) -> None:
        if self.caps[claim.destination_id] is not None:
            with self.lock:
                self.count[claim.destination_id] -= 1


@dataclass(frozen=True)
class Plan:
    caps: tuple[int | None, ...]  # one destination each; None: uncapped
    events: int
    seeds: tuple[int, ...]  # one claimer each
    max_limit: int
    weights: tuple[int, ...]  # of OUTCOMES
    refills: tuple[bool, ...]  # per claimer: its result writes refill the slots they free
    spares: tuple[bool, ...]  # per claimer (with refills): ...and claim spares to hand on to


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    caps = tuple(draw(st.lists(st.one_of(st.none(), st.integers(1, 6)), min_size=1,
                               max_size=4)))
    claimers = draw(st.integers(2, 6))
    return Plan(
        caps=caps if any(c is not None for c in caps) else (*caps, 3),
        events=draw(st.integers(1, 60)),
        seeds=tuple(draw(st.lists(st.integers(0, 2**32), min_size=claimers,
                                  max_size=claimers))),
        max_limit=draw(st.integers(1, 20)),
        weights=(draw(st.integers(1, 10)), draw(st.integers(0, 5)), draw(st.integers(0, 2)),
                 draw(st.integers(0, 3)), draw(st.integers(0, 2))),
        refills=tuple(draw(st.lists(st.booleans(), min_size=claimers, max_size=claimers))),
        spares=tuple(draw(st.lists(st.booleans(), min_size=claimers, max_size=claimers))),
    )


def claimer(dsn: str, name: str, plan: Plan, seed: int, refills: bool, spares: bool,
            running: Running, found: list[str], done: threading.Event) -> None:
    """Claim, then answer each claim by the plan's outcome mix, until nothing is left;
    with `refills`, as a worker does with capped destinations: each success asks the
    result write to claim its slot again, and what that refills is answered next. With
    `spares` too, the write also claims spares, and a success with a spare of its
    destination at hand starts it at once and hands it its slot."""
    rng = random.Random(seed)
    pending: list[queue.Claim] = []  # running: answered in the next round
    held: dict[int, list[queue.Claim]] = {}  # spares not started, per destination
    handed: set[int] = set()  # spares started in a handed-on slot
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.monotonic()
        while time.monotonic() - started < DEADLINE_S:
            if pending:
                claims, pending = pending, []
            else:
                unsent = [c for waiting in held.values() for c in waiting]
                if unsent and rng.random() < 0.5:
                    # Spares with nothing running beside them go back.
                    held.clear()
                    queue.record_results(conn, name, [
                        Result(c.id, c.attempt, "released", now(conn), claim_token=c.claim_token)
                        for c in unsent], NO_BREAKER)
                    found += violations(conn)
                    continue
                claims = queue.claim_batch(conn, name, rng.randint(1, plan.max_limit),
                                           LEASE_MS)
                for claim in claims:
                    running.start(claim, found)
            found += violations(conn)
            if not claims:
                if held:
                    continue  # released above, by and by
                if done.is_set() or not conn.execute("SELECT 1 FROM deliveries LIMIT 1"
                                                     ).fetchone():
                    done.set()
                    return
                continue
            t = now(conn)
            results, reaped = [], []
            wanted: dict[int, int] = {}  # destination -> successes, for the refill
            ask_spares: dict[int, int] = {}
            for claim in claims:
                running.end(claim)
                outcome = rng.choices(OUTCOMES, plan.weights)[0]
                if outcome == "retry" and claim.attempt >= MAX_ATTEMPTS:
                    outcome = "dead"
                if outcome == "reaped":
                    reaped.append(claim.id)
                    continue
                result = Result(claim.id, claim.attempt, outcome, t, 1, 500, "x", None,
                                t if outcome == "retry" else None, claim.claim_token)
                cap = claim.max_in_flight
                if outcome == "delivered" and cap is not None:
                    at_hand = held.get(claim.destination_id)
                    holds = claim.holds_slot or claim.id in handed
                    if spares and holds and at_hand:
                        spare = at_hand.pop()
                        if not at_hand:
                            del held[claim.destination_id]
                        running.start(spare, found)
                        handed.add(spare.id)
                        pending.append(spare)
                        result = msgspec.structs.replace(result, slot_to=spare.id,
                                                         slot_to_token=spare.claim_token)
                    else:
                        wanted[claim.destination_id] = wanted.get(claim.destination_id, 0) + 1
                    if spares:
                        ask_spares[claim.destination_id] = cap - len(at_hand or ())
                results.append(result)
            if refills:
                refilled = queue.record_results_and_refill(conn, name, results, LEASE_MS,
                                                           wanted, NO_BREAKER, ask_spares)
                for claim in refilled:
                    if claim.holds_slot:
                        running.start(claim, found)
                        pending.append(claim)
                    else:
                        held.setdefault(claim.destination_id, []).append(claim)
            else:
                queue.record_results(conn, name, results, NO_BREAKER)
            found += violations(conn)
            if reaped:
                # A lost host: its leases run out and the reaper returns them.
                conn.execute("UPDATE deliveries SET locked_until = now() - interval '1 s'"
                             " WHERE id = ANY(%s)", (reaped,))
                reap_expired(conn, MAX_ATTEMPTS)
                found += violations(conn)
        found.append(f"{name}: not drained after {DEADLINE_S} s")


def watch(dsn: str, found: list[str], done: threading.Event) -> int:
    checks = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not done.is_set():
            found += violations(conn)
            checks += 1
    return checks


def run_plan(dsn: str, conn: psycopg.Connection, plan: Plan) -> list[str]:
    truncate_all(conn)
    destinations = [add_destination(conn, max_in_flight=cap) for cap in plan.caps]
    with conn.transaction():
        queue.enqueue_events(conn, [EventIn("t", "{}", destinations)
                                    for _ in range(plan.events)])
    found: list[str] = []
    done = threading.Event()
    running = Running(dict(zip(destinations, plan.caps, strict=True)))
    threads = [threading.Thread(target=claimer,
                                args=(dsn, f"w{n}", plan, seed, refills, spares, running,
                                      found, done))
               for n, (seed, refills, spares)
               in enumerate(zip(plan.seeds, plan.refills, plan.spares, strict=True))]
    watcher = threading.Thread(target=watch, args=(dsn, found, done))
    for thread in [*threads, watcher]:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    found += violations(conn)
    left = conn.execute("SELECT count(*) FROM deliveries").fetchone()
    if left and left[0]:
        found.append(f"{left[0]} deliveries left undrained")
    counters = conn.execute("SELECT sum(in_flight) FROM destinations").fetchone()
    if counters and counters[0]:
        found.append(f"slot counters at {counters[0]} with nothing in flight")
    return found


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=plans())
def test_cap_is_never_exceeded_and_the_counter_is_exact(
    dsn: str, conn: psycopg.Connection, plan: Plan
) -> None:
    assert run_plan(dsn, conn, plan) == []


def test_a_cap_set_or_removed_while_deliveries_are_in_flight(
    conn: psycopg.Connection,
) -> None:
    """Claims made without a cap hold no slot, so setting a cap under them, or removing
    one, never drives the counter away from the slots really held."""
    dest = add_destination(conn)
    with conn.transaction():
        queue.enqueue_events(conn, [EventIn("t", "{}", [dest]) for _ in range(10)])
    uncapped = queue.claim_batch(conn, "w", 4, LEASE_MS)
    conn.execute("UPDATE destinations SET max_in_flight = 5 WHERE id = %s", (dest,))
    capped = queue.claim_batch(conn, "w", 10, LEASE_MS)
    # Nine in flight, five of them holding the cap's slots: the four claimed before the
    # cap hold none.
    assert len(capped) == 5 and violations(conn) == []
    held = conn.execute("SELECT count(*) FROM deliveries WHERE status = 'in_flight'"
                        " AND holds_slot").fetchone()
    assert held == (5,)
    t = now(conn)
    finish: Sequence[queue.Claim] = uncapped
    queue.record_results(conn, "w", [Result(c.id, c.attempt, "delivered", t, 1, 200)
                                     for c in finish])
    assert violations(conn) == []
    conn.execute("UPDATE destinations SET max_in_flight = NULL WHERE id = %s", (dest,))
    queue.release_claims(conn, "w", MAX_ATTEMPTS)
    row = conn.execute("SELECT in_flight FROM destinations WHERE id = %s", (dest,)).fetchone()
    assert row == (0,)

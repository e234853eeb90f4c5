"""max_in_flight with several concurrent claimers: the cap is never exceeded, and each
capped destination's slot counter equals the number of its in-flight deliveries holding a
slot after every step, and likewise each tenant's with a max_in_flight of its own over all
its destinations (claim_limited_tenants.sql, holds_tenant_slot), whatever mix of claims,
results, releases, reaps and slot refills (a result write that claims the freed slots
again, refill_slots.sql) runs at once. Some claimers also hold spares (claims that take
no slot) and hand a success's slot on to one (record_results.sql, `handed`), as a worker
does: the requests they have "running" for a destination or a tenant, counted across
claimers, never exceed its cap.

Each claimer is a thread with the worker's own claim and record path (tests/kit/
worker_path.py: its two connections and the queue_async functions DeliveryWorker and its
recorder call), like a worker process, and builds its results as the worker does, with
their claim's token. Results of claims it lost (reaped) or gave back (released) are
written again later, as a worker that came back or a late duplicate would: they must
change nothing. After each of its steps a claimer checks the invariants in one statement
(one snapshot: a claim or result changes the counter and the rows in one transaction),
and so does a watcher thread in a loop.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from dataclasses import dataclass

import msgspec
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.db import queue
from engine.db.queue import BreakerSettings, EventIn, Result
from engine.maintenance.reaper import reap_expired
from tests.kit import queue_sync
from tests.kit.data import LEASE_MS, add_destination, add_tenant, now
from tests.kit.dbserver import truncate_all
from tests.kit.worker_path import WorkerPath, answer, released

pytestmark = pytest.mark.pg_versions

EXAMPLES = 40
MAX_ATTEMPTS = 4
OUTCOMES = ("delivered", "retry", "dead", "released", "reaped")
# Only a guard against a claimer that never finishes, not a timing claim: a plan of 140
# deliveries claimed one at a time with three releases in five took over 60 s with the
# suite running twice beside it (2026-12-01, tools/test-loaded.sh with CI alongside).
DEADLINE_S = 300.0
# How long the test waits for its threads beyond that: a claimer checks its deadline only
# between steps.
JOIN_GRACE_S = 60.0
NO_BREAKER = BreakerSettings(threshold=1_000_000_000)
# Every retry is due at once; the last attempt's failure is dead.
SCHEDULE = (0.0,) * (MAX_ATTEMPTS - 1)

# Per capped destination and per capped tenant, in one snapshot: its counter, the
# in-flight deliveries holding one of its slots, and its cap. (More rows than a
# destination's cap may be in flight: spares hold no slot.)
CHECK = """
SELECT 'destination', dest.id, dest.in_flight, dest.max_in_flight,
       count(d.id) FILTER (WHERE d.holds_slot) AS holding
  FROM destinations dest
  LEFT JOIN deliveries d ON d.destination_id = dest.id AND d.status = 'in_flight'
 WHERE dest.max_in_flight IS NOT NULL
 GROUP BY dest.id
UNION ALL
SELECT 'tenant', t.id, t.in_flight, t.max_in_flight,
       count(d.id) FILTER (WHERE d.holds_tenant_slot) AS holding
  FROM tenants t
  LEFT JOIN deliveries d ON d.tenant_id = t.id AND d.status = 'in_flight'
 WHERE t.max_in_flight IS NOT NULL
 GROUP BY t.id
"""


def violations(conn: psycopg.Connection) -> list[str]:
    found = []
    for kind, key, counter, cap, holding in conn.execute(CHECK).fetchall():
        if counter != holding:
            found.append(f"{kind} {key}: counter {counter}, {holding} holding a slot")
        if holding > cap:
            found.append(f"{kind} {key}: {holding} slots held over its cap {cap}")
    return found


class Running:
    """The requests the claimers have running per destination and per tenant (a claim
    that holds a slot, from its claim to its answer; a spare, from the answer that handed
    it a slot to its own), checked against the caps at every start."""

    def __init__(self, caps: dict[int, int | None], owners: dict[int, int],
                 tenant_caps: dict[int, int | None]) -> None:
        self.caps = {("destination", d): cap for d, cap in caps.items()}
        self.caps |= {("tenant", t): cap for t, cap in tenant_caps.items()}
        self.owners = owners  # destination -> tenant
        self.lock = threading.Lock()
        self.count: dict[tuple[str, int], int] = {}

    def _keys(self, claim: queue.Claim) -> list[tuple[str, int]]:
        keys = [("destination", claim.destination_id),
                ("tenant", self.owners[claim.destination_id])]
        return [key for key in keys if self.caps[key] is not None]

    def start(self, claim: queue.Claim, found: list[str]) -> None:
        for key in self._keys(claim):
            with self.lock:
                n = self.count[key] = self.count.get(key, 0) + 1
            if n > (cap := self.caps[key] or 0):
                found.append(f"{key[0]} {key[1]}: {n} requests running over its cap {cap}")

    def end(self, claim: queue.Claim) -> None:
        for key in self._keys(claim):
            with self.lock:
                self.count[key] -= 1


@dataclass(frozen=True)
class Plan:
    caps: tuple[int | None, ...]  # one destination each; None: uncapped
    tenant_caps: tuple[int | None, ...]  # one tenant each; None: no max_in_flight of its own
    owners: tuple[int, ...]  # per destination: its tenant's index in tenant_caps
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
    tenant_caps = tuple(draw(st.lists(st.one_of(st.none(), st.integers(1, 8)), min_size=1,
                                      max_size=3)))
    caps = caps if any(c is not None for c in caps) else (*caps, 3)
    return Plan(
        caps=caps,
        tenant_caps=tenant_caps,
        owners=tuple(draw(st.lists(st.integers(0, len(tenant_caps) - 1), min_size=len(caps),
                                   max_size=len(caps)))),
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
    try:
        path = WorkerPath(dsn, name, lease_ms=LEASE_MS, breaker=NO_BREAKER)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:  # checks, and the reaper
                claim_as_a_worker(path, conn, plan, seed, refills, spares, running, found,
                                  done)
        finally:
            path.close()
    except BaseException:
        found.append(f"{name} failed:\n{traceback.format_exc()}")
        done.set()


def claim_as_a_worker(path: WorkerPath, conn: psycopg.Connection, plan: Plan, seed: int,
                      refills: bool, spares: bool, running: Running, found: list[str],
                      done: threading.Event) -> None:
    """Claim (first_attempt_share 0.25 of the limit in reserve, as a worker's default),
    then answer each claim by the plan's outcome mix, until nothing is left; with
    `refills`, as a worker does with capped destinations: each success asks the result
    write to claim its slot again, and what that refills is answered next. With `spares`
    too, the write also claims spares, and a success with a spare of its destination at
    hand starts it at once and hands it its slot. Now and then, the results of claims
    this claimer lost or gave back are written again: none may apply."""
    name = path.worker
    rng = random.Random(seed)
    pending: list[queue.Claim] = []  # running: answered in the next round
    held: dict[int, list[queue.Claim]] = {}  # spares not started, per destination
    handed: set[int] = set()  # spares started in a handed-on slot
    stale: list[Result] = []  # results of claims reaped or released meanwhile
    # Released claims by delivery id: if this claimer gets the delivery back at the same
    # attempt, only the token tells the old claim's result from the new one's.
    given_back: dict[int, Result] = {}
    started = time.monotonic()
    while time.monotonic() - started < DEADLINE_S:
        if stale and rng.random() < 0.3:
            late, stale = stale, []
            applied = path.record(late)
            if applied:
                found.append(f"{name}: {applied} of {len(late)} stale results (claims"
                             " reaped or released, the rows claimed again) applied")
            found += violations(conn)
            continue
        if pending:
            claims, pending = pending, []
        else:
            unsent = [c for waiting in held.values() for c in waiting]
            if unsent and rng.random() < 0.5:
                # Spares with nothing running beside them go back.
                held.clear()
                spares_back = [released(c) for c in unsent]
                path.record(spares_back)
                given_back.update((r.id, r) for r in spares_back)
                found += violations(conn)
                continue
            limit = rng.randint(1, plan.max_limit)
            claims = path.claim(limit, int(0.25 * limit))
            for claim in claims:
                running.start(claim, found)
        again = [given_back.pop(c.id) for c in claims if c.id in given_back]
        if same_attempt := [r for r in again
                            if r.attempt == next(c.attempt for c in claims if c.id == r.id)]:
            # Back to this claimer at the same attempt: the released claim's result
            # written again now must not touch the new claim (nor its slot).
            applied = path.record(same_attempt)
            if applied:
                found.append(f"{name}: {applied} of {len(same_attempt)} stale results of"
                             " released claims applied to the same deliveries claimed"
                             " again by the same worker at the same attempt")
            found += violations(conn)
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
            if outcome == "reaped":
                reaped.append(claim.id)
                # The host comes back later and writes its success.
                stale.append(answer(claim, 200, t, SCHEDULE))
                continue
            result = (released(claim, t) if outcome == "released"
                      else answer(claim, 200 if outcome == "delivered" else 500, t,
                                  SCHEDULE if outcome == "retry" else ()))
            if outcome == "released":
                given_back[claim.id] = result
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
            refilled = path.record_and_refill(results, wanted, ask_spares)
            for claim in refilled:
                if claim.holds_slot:
                    running.start(claim, found)
                    pending.append(claim)
                else:
                    held.setdefault(claim.destination_id, []).append(claim)
        else:
            applied = path.record(results)
            if applied != len(results):
                found.append(f"{name}: {applied} of its {len(results)} results applied")
        found += violations(conn)
        if reaped:
            # A lost host: its leases run out and the reaper returns them.
            conn.execute("UPDATE deliveries SET locked_until = now() - interval '1 s'"
                         " WHERE id = ANY(%s)", (reaped,))
            reap_until_returned(conn, name, reaped)
            found += violations(conn)
    found.append(f"{name}: not drained after {DEADLINE_S} s")


def reap_until_returned(conn: psycopg.Connection, worker: str, ids: list[int]) -> None:
    """Reap until none of `ids` is still this worker's claim. The reaper skips rows
    another transaction has locked (FOR UPDATE ... SKIP LOCKED): a claim statement whose
    snapshot saw one of them still pending keeps it locked until it commits, though it
    does not take it. The production reaper takes such a row on its next round; until it
    does, the claim is still this worker's and its result rightly applies, so the test
    calls a result stale only once its row has left the worker."""
    while True:
        reap_expired(conn, MAX_ATTEMPTS)
        if not conn.execute("SELECT 1 FROM deliveries WHERE id = ANY(%s) AND locked_by = %s"
                            " LIMIT 1", (ids, worker)).fetchone():
            return
        time.sleep(0.01)


def watch(dsn: str, found: list[str], done: threading.Event) -> int:
    checks = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not done.is_set():
            found += violations(conn)
            checks += 1
    return checks


def run_plan(dsn: str, conn: psycopg.Connection, plan: Plan) -> list[str]:
    truncate_all(conn)
    tenants = [add_tenant(conn, f"t{n}", max_in_flight=cap)
               for n, cap in enumerate(plan.tenant_caps)]
    destinations = [add_destination(conn, max_in_flight=cap, tenant_id=tenants[owner])
                    for cap, owner in zip(plan.caps, plan.owners, strict=True)]
    owners = {dest: tenants[owner]
              for dest, owner in zip(destinations, plan.owners, strict=True)}
    with conn.transaction():
        # Each event to every destination of one tenant, the tenants in turn.
        queue_sync.enqueue_events(conn, [
            EventIn("t", "{}", [d for d in destinations if owners[d] == tenant],
                    tenant_id=tenant)
            for n in range(plan.events)
            for tenant in [tenants[n % len(tenants)]]
            if tenant in owners.values()])
    found: list[str] = []
    done = threading.Event()
    running = Running(dict(zip(destinations, plan.caps, strict=True)), owners,
                      dict(zip(tenants, plan.tenant_caps, strict=True)))
    threads = [threading.Thread(target=claimer,
                                args=(dsn, f"w{n}", plan, seed, refills, spares, running,
                                      found, done))
               for n, (seed, refills, spares)
               in enumerate(zip(plan.seeds, plan.refills, plan.spares, strict=True))]
    watcher = threading.Thread(target=watch, args=(dsn, found, done), daemon=True)
    for thread in [*threads, watcher]:
        thread.daemon = True
        thread.start()
    deadline = time.monotonic() + DEADLINE_S + JOIN_GRACE_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    done.set()
    watcher.join(JOIN_GRACE_S)
    stuck = [f"claimer w{n}" for n, thread in enumerate(threads) if thread.is_alive()]
    stuck += ["the watcher"] if watcher.is_alive() else []
    assert not stuck, (f"{', '.join(stuck)} did not finish within"
                       f" {DEADLINE_S + JOIN_GRACE_S:.0f} s; found so far: {found}")
    found += violations(conn)
    left = conn.execute("SELECT count(*) FROM deliveries").fetchone()
    if left and left[0]:
        found.append(f"{left[0]} deliveries left undrained")
    counters = conn.execute("SELECT (SELECT sum(in_flight) FROM destinations),"
                            " (SELECT sum(in_flight) FROM tenants)").fetchone()
    if counters and any(counters):
        found.append(f"slot counters at {counters} with nothing in flight")
    return found


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=plans())
def test_cap_is_never_exceeded_and_the_counter_is_exact(
    dsn: str, conn: psycopg.Connection, plan: Plan
) -> None:
    assert run_plan(dsn, conn, plan) == []


def test_a_cap_set_or_removed_while_deliveries_are_in_flight(
    dsn: str, conn: psycopg.Connection,
) -> None:
    """Claims made without a cap hold no slot, so setting a cap under them, or removing
    one, never drives the counter away from the slots really held."""
    dest = add_destination(conn)
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [dest]) for _ in range(10)])
    path = WorkerPath(dsn, "w", lease_ms=LEASE_MS, breaker=NO_BREAKER)
    try:
        uncapped = path.claim(4)
        conn.execute("UPDATE destinations SET max_in_flight = 5 WHERE id = %s", (dest,))
        capped = path.claim(10)
        # Nine in flight, five of them holding the cap's slots: the four claimed before
        # the cap hold none.
        assert len(capped) == 5 and violations(conn) == []
        held = conn.execute("SELECT count(*) FROM deliveries WHERE status = 'in_flight'"
                            " AND holds_slot").fetchone()
        assert held == (5,)
        t = now(conn)
        assert path.record([answer(c, 200, t, SCHEDULE) for c in uncapped]) == 4
    finally:
        path.close()
    assert violations(conn) == []
    conn.execute("UPDATE destinations SET max_in_flight = NULL WHERE id = %s", (dest,))
    queue.release_claims(conn, "w", MAX_ATTEMPTS)
    row = conn.execute("SELECT in_flight FROM destinations WHERE id = %s", (dest,)).fetchone()
    assert row == (0,)

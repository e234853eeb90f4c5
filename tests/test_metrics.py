"""/metrics: samples summed across real processes, database gauges equal to SQL."""

from __future__ import annotations

import multiprocessing
import os

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine.db.queue import EventIn
from engine.observe import metrics
from tests.kit import queue_sync
from tests.kit.data import LEASE_MS, add_destination


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _child_records(outcome: str, count: int) -> None:
    inst = metrics.instruments()
    for _ in range(count):
        inst.deliveries.labels(outcome).inc()
        inst.attempt_durations.observe_many(outcome, [0.02])
    inst.in_flight.set(3)


@pytest.fixture
def multiproc_dir() -> object:
    folder = metrics.prepare_multiprocess_dir()
    yield folder
    metrics.remove_multiprocess_dir(folder)


def test_counters_are_summed_across_processes(multiproc_dir: str) -> None:
    ctx = multiprocessing.get_context("spawn")  # a child that imports metrics afresh
    children = [ctx.Process(target=_child_records, args=(o, n))
                for o, n in (("delivered", 5), ("delivered", 7), ("retry", 2))]
    for child in children:
        child.start()
    for child in children:
        child.join(300)  # spawn imports afresh: slow on a starved machine
        assert child.exitcode == 0
    found = samples(metrics.render(None))
    assert found[("engine_deliveries_total", (("outcome", "delivered"),))] == 12
    assert found[("engine_deliveries_total", (("outcome", "retry"),))] == 2
    assert found[("engine_attempt_duration_seconds_count", (("outcome", "delivered"),))] == 12
    # in_flight is live: it counts until the supervisor marks an exited child dead.
    assert found[("engine_in_flight", ())] == 9
    for child in children:
        metrics.child_exited(child.pid)
    after = samples(metrics.render(None))
    assert after.get(("engine_in_flight", ()), 0) == 0
    assert os.listdir(multiproc_dir)


def test_database_gauges_equal_sql(dsn: str, conn: psycopg.Connection) -> None:
    first = add_destination(conn)
    add_destination(conn, breaker="open", paused_until="2999-01-01T00:00:00Z")
    with conn.transaction():
        queue_sync.enqueue_events(conn, [EventIn("t", "{}", [first]) for _ in range(5)])
    queue_sync.claim_batch(conn, "w", 2, LEASE_MS)
    conn.execute("UPDATE deliveries SET next_attempt_at = now() - interval '90 seconds'"
                 " WHERE status = 'pending'")
    # This session's table statistics (n_dead_tup) reach the shared view when it flushes
    # them, at most once a second otherwise: flush now, before both reads.
    conn.execute("SELECT pg_stat_force_next_flush()")
    found = samples(metrics.render(dsn))
    depth = dict(conn.execute(
        "SELECT status::text, count(*) FROM deliveries GROUP BY status").fetchall())
    assert found[("engine_queue_depth", (("status", "pending"),))] == depth["pending"] == 3
    assert found[("engine_queue_depth", (("status", "in_flight"),))] == depth["in_flight"] == 2
    assert found[("engine_destinations_breaker", (("state", "open"),))] == 1
    assert found[("engine_destinations_breaker", (("state", "closed"),))] == 1
    assert found[("engine_destinations_breaker", (("state", "half_open"),))] == 0
    assert 90 <= found[("engine_oldest_due_age_seconds", ())] < 150
    dead = dict(conn.execute(
        "SELECT relname::text, n_dead_tup FROM pg_stat_user_tables").fetchall())
    assert found[("engine_dead_tuples", (("table", "deliveries"),))] == dead["deliveries"]


@given(st.lists(st.tuples(st.sampled_from(["delivered", "retry"]),
                          st.one_of(st.sampled_from(metrics.ATTEMPT_BUCKETS),
                                    st.floats(0, 120, allow_nan=False))), max_size=60))
def test_attempt_durations_render_as_a_histogram_observed_per_value(
    attempts: list[tuple[str, float]],
) -> None:
    """The bulk path (docs/decisions/0009-bulk-histogram-observe.md) against prometheus-
    client's own Histogram observed once per value, bucket boundaries included."""
    public_registry, bulk_registry = CollectorRegistry(), CollectorRegistry()
    public = Histogram(metrics.ATTEMPT_HISTOGRAM, "HTTP attempt latency", ["outcome"],
                       buckets=metrics.ATTEMPT_BUCKETS, registry=public_registry)
    bulk = metrics.AttemptDurations(bulk_registry)
    for outcome, amount in attempts:
        public.labels(outcome).observe(amount)
    for outcome in ("delivered", "retry"):
        bulk.observe_many(outcome, [amount for o, amount in attempts if o == outcome])

    def counts(body: bytes) -> dict:
        return {key: value for key, value in samples(body).items()
                if not key[0].endswith("_created")}  # when each was made

    rendered = generate_latest(metrics.AttemptHistogramView(bulk_registry))
    # Outcomes never observed: the public Histogram shows none; the bulk one has no child.
    assert counts(rendered) == pytest.approx(counts(generate_latest(public_registry)))
    assert b"# TYPE engine_attempt_duration_seconds histogram" in rendered
    assert metrics.ATTEMPT_BUCKET_COUNTER.encode() not in rendered


def test_tenant_backlog_series_are_bounded(dsn: str, conn: psycopg.Connection) -> None:
    # 50 tenants with backlogs of 1 ... 50 deliveries; the one with 45 is named `other`.
    sizes = {("other" if n == 45 else f"tenant-{n:02d}"): n for n in range(1, 51)}
    events = []
    for uid, size in sizes.items():
        row = conn.execute("INSERT INTO tenants (uid) VALUES (%s) RETURNING id", [uid]).fetchone()
        assert row is not None
        destination = add_destination(conn, url=f"http://127.0.0.1:9/{uid}", tenant_id=row[0])
        events += [EventIn("t", "{}", [destination], tenant_id=row[0]) for _ in range(size)]
    with conn.transaction():
        queue_sync.enqueue_events(conn, events)
    claimed = queue_sync.claim_batch(conn, "w", 30, LEASE_MS)
    found = samples(metrics.render(dsn))
    series = {dict(labels)["tenant"]: {} for name, labels in found
              if name == "engine_tenant_backlog"}
    for (name, labels), value in found.items():
        if name == "engine_tenant_backlog":
            series[dict(labels)["tenant"]][dict(labels)["status"]] = value
    assert len(series) <= metrics.TENANT_SERIES + 1
    largest = sorted(sizes, key=sizes.__getitem__, reverse=True)[:metrics.TENANT_SERIES]
    assert set(series) == {*largest, metrics.OTHER_TENANTS}
    assert "other" in series  # a tenant named so is its own series, not the rest's
    for uid in largest:
        assert series[uid]["pending"] + series[uid]["in_flight"] == sizes[uid]
    rest = sum(sizes.values()) - sum(sizes[uid] for uid in largest)
    assert sum(series[metrics.OTHER_TENANTS].values()) == rest
    assert sum(s["in_flight"] for s in series.values()) == len(claimed) == 30

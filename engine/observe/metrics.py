"""Prometheus metrics, aggregated across the engine's processes.

The supervisor calls `prepare_multiprocess_dir()` before it forks: every child then writes
its samples to files in that folder (prometheus-client multiprocess mode) and `/metrics`
in any process renders the sum over all of them. Gauges read from the database (queue
depth, oldest due delivery, breaker states, dead tuples) are computed at scrape time, so
they are as fresh as the scrape and cost nothing between scrapes.

Process-local instruments are created on first use by `instruments()`, not at import:
prometheus-client picks its storage (in memory or multiprocess files) when a metric is
created, and a module imported before PROMETHEUS_MULTIPROC_DIR was set must not freeze
the wrong choice.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache

import psycopg
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.db import queries
from engine.db.sql_params import TenantTopParams
from engine.domain import Result

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST
DELIVERY_STATUSES = ("pending", "in_flight")
BREAKER_STATES = ("closed", "open", "half_open")
# /metrics labels the backlog by tenant for this many tenants, the largest backlogs; the
# rest are summed under OTHER_TENANTS, which no uid can be (a uid has no parentheses,
# schema/016_tenants.sql), so a tenant named "other" stays its own series.
TENANT_SERIES = 10
OTHER_TENANTS = "(other)"

# Attempt latency spans loopback (ms) to a timed-out request (tens of seconds).
ATTEMPT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
CLAIM_SIZE_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
CLAIM_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


ATTEMPT_HISTOGRAM = "engine_attempt_duration_seconds"
# What a worker writes; `render` shows it as the histogram above (AttemptDurations).
ATTEMPT_BUCKET_COUNTER = "engine_attempt_duration_bucket_count"
ATTEMPT_SUM_COUNTER = "engine_attempt_duration_sum_seconds"
_ATTEMPT_BOUNDS = tuple(float(b) for b in ATTEMPT_BUCKETS)
# Each bucket's `le` label as prometheus-client writes it ("0.005", "1.0", "+Inf").
_ATTEMPT_LE = (*(repr(b) for b in _ATTEMPT_BOUNDS), "+Inf")


class AttemptDurations:
    """engine_attempt_duration_seconds (labels: outcome), advanced a batch at a time.

    prometheus-client's `Histogram` has no bulk observe, and in multiprocess mode every
    `observe` is two locked writes to a memory-mapped file: 15-40 times the cost of one
    increment per bucket touched (docs/decisions/0009-bulk-histogram-observe.md). So a
    worker counts its batch per bucket in two public Counters (attempts per bucket, not
    cumulative; seconds summed) and `render` shows them as one histogram family with the
    usual cumulative `_bucket`, `_sum` and `_count` samples: the same name and labels a
    `Histogram` would have.
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.per_bucket = Counter(
            ATTEMPT_BUCKET_COUNTER, "HTTP attempts per latency bucket (not cumulative)",
            ["outcome", "le"], registry=registry,
        )
        self.seconds = Counter(
            ATTEMPT_SUM_COUNTER, "HTTP attempt seconds", ["outcome"], registry=registry
        )
        # The children, created once: `labels()` takes a lock and builds a key each call.
        self._children: dict[tuple[str, int], Counter] = {}

    def observe_many(self, outcome: str, amounts: Sequence[float]) -> None:
        """As `observe(amount)` for each amount on the outcome's histogram."""
        for index, n in Tally(bisect_left(_ATTEMPT_BOUNDS, s) for s in amounts).items():
            child = self._children.get((outcome, index))
            if child is None:
                child = self.per_bucket.labels(outcome, _ATTEMPT_LE[index])
                self._children[(outcome, index)] = child
            child.inc(n)
        self.seconds.labels(outcome).inc(sum(amounts))


def as_attempt_histogram(families: Iterable[Metric]) -> Iterator[Metric]:
    """`families` with AttemptDurations' two counters replaced by the histogram they
    count; every other family as it comes."""
    in_bucket: dict[tuple[str, str], float] = {}
    seconds: dict[str, float] = {}
    for family in families:
        if family.name == ATTEMPT_BUCKET_COUNTER:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    key = (sample.labels["outcome"], sample.labels["le"])
                    in_bucket[key] = in_bucket.get(key, 0.0) + sample.value
        elif family.name == ATTEMPT_SUM_COUNTER:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    outcome = sample.labels["outcome"]
                    seconds[outcome] = seconds.get(outcome, 0.0) + sample.value
        else:
            yield family
    histogram = HistogramMetricFamily(
        ATTEMPT_HISTOGRAM, "HTTP attempt latency", labels=["outcome"]
    )
    for outcome in sorted({outcome for outcome, _ in in_bucket}):
        cumulative = 0.0
        buckets = []
        for le in _ATTEMPT_LE:
            cumulative += in_bucket.get((outcome, le), 0.0)
            buckets.append((le, cumulative))
        histogram.add_metric([outcome], buckets, seconds.get(outcome, 0.0))
    yield histogram


class AttemptHistogramView(Collector):
    """A collector (the multiprocess files, or this process's registry) as `/metrics`
    shows it: with the attempt histogram (`as_attempt_histogram`)."""

    def __init__(self, source: Collector) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        return as_attempt_histogram(self.source.collect())


@dataclass(frozen=True)
class Instruments:
    deliveries: Counter  # labels: outcome (delivered, retry, dead, gone, released)
    attempt_durations: AttemptDurations  # labels: outcome
    in_flight: Gauge  # requests open right now, summed over live processes
    claim_batch_size: Histogram
    claim_seconds: Histogram
    ingested_events: Counter
    trace_spans_dropped: Counter  # attempt spans not exported (engine/observe/tracing.py)


@cache
def instruments() -> Instruments:
    """The process's instruments, created once, in whatever mode the environment says."""
    # Re-read the environment: prometheus_client chose at its import time.
    values.ValueClass = values.get_value_class()
    return Instruments(
        deliveries=Counter(
            "engine_deliveries", "Attempt outcomes recorded by workers", ["outcome"]
        ),
        attempt_durations=AttemptDurations(),
        in_flight=Gauge(
            "engine_in_flight", "HTTP requests open now", multiprocess_mode="livesum"
        ),
        claim_batch_size=Histogram(
            "engine_claim_batch_size", "Deliveries per claim", buckets=CLAIM_SIZE_BUCKETS
        ),
        claim_seconds=Histogram(
            "engine_claim_duration_seconds", "Claim statement latency",
            buckets=CLAIM_LATENCY_BUCKETS,
        ),
        ingested_events=Counter("engine_ingested_events", "Events accepted by ingress"),
        trace_spans_dropped=Counter(
            "engine_trace_spans_dropped",
            "Attempt spans dropped: the export queue was full or the collector failed"),
    )


def count_results(metrics: Instruments, batch: Sequence[Result]) -> None:
    """A worker's recorded batch into the delivery counter and the attempt histogram.
    Per batch, not per delivery: in multiprocess mode every update is a locked write to a
    shared file."""
    durations: dict[str, list[float]] = {}
    for r in batch:
        if r.duration_ms is not None:
            durations.setdefault(r.outcome, []).append(r.duration_ms / 1000)
    for outcome, n in Tally(r.outcome for r in batch).items():
        metrics.deliveries.labels(outcome).inc(n)
    for outcome, seconds in durations.items():
        metrics.attempt_durations.observe_many(outcome, seconds)


def prepare_multiprocess_dir() -> str:
    """Point PROMETHEUS_MULTIPROC_DIR at a fresh, empty folder (supervisor, before forking).
    A fresh folder per run: files left by a previous run would be summed in."""
    folder = tempfile.mkdtemp(prefix="engine-metrics-")
    os.environ[MULTIPROC_ENV] = folder
    # Metrics created from now on, here or in a forked child, write to the folder.
    values.ValueClass = values.get_value_class()
    return folder


def remove_multiprocess_dir(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    if os.environ.get(MULTIPROC_ENV) == folder:
        del os.environ[MULTIPROC_ENV]
        values.ValueClass = values.get_value_class()


def child_exited(pid: int) -> None:
    """Drop a dead child's live gauges (supervisor, after reaping it)."""
    folder = os.environ.get(MULTIPROC_ENV)
    if folder:
        multiprocess.mark_process_dead(pid, folder)


class DatabaseCollector(Collector):
    """Gauges read from the database at scrape time, through a short connection."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                queries.SCRAPE_STATEMENT_TIMEOUT.run_sync(conn)
                rows = queries.METRICS_GAUGES.run_sync(conn).fetchall()
                tenants = queries.METRICS_TENANT_BACKLOG.run_sync(
                    conn, TenantTopParams(top_n=TENANT_SERIES)).fetchall()
        except psycopg.Error:
            # A scrape still answers (process metrics are worth having in an outage).
            yield GaugeMetricFamily("engine_database_up", "Database reachable", value=0)
            return
        yield GaugeMetricFamily("engine_database_up", "Database reachable", value=1)
        yield from database_families(rows)
        yield tenant_backlog_family(tenants)


def database_families(rows: list[tuple[str, str, float]]) -> Iterator[GaugeMetricFamily]:
    depth = dict.fromkeys(DELIVERY_STATUSES, 0.0)
    breakers = dict.fromkeys(BREAKER_STATES, 0.0)
    oldest = 0.0
    dead_tuples: dict[str, float] = {}
    for metric, label, value in rows:
        if metric == "depth":
            depth[label] = value
        elif metric == "breaker":
            breakers[label] = value
        elif metric == "oldest_due_age":
            oldest = value
        elif metric == "dead_tuples":
            dead_tuples[label] = value
    family = GaugeMetricFamily(
        "engine_queue_depth", "Deliveries in the hot queue by status", labels=["status"]
    )
    for status, count in depth.items():
        family.add_metric([status], count)
    yield family
    yield GaugeMetricFamily(
        "engine_oldest_due_age_seconds",
        "How long the oldest due pending delivery has waited past its due time",
        value=oldest,
    )
    family = GaugeMetricFamily(
        "engine_destinations_breaker", "Destinations by breaker state", labels=["state"]
    )
    for state, count in breakers.items():
        family.add_metric([state], count)
    yield family
    family = GaugeMetricFamily(
        "engine_dead_tuples", "Dead tuples per table (pg_stat_user_tables)", labels=["table"]
    )
    for table, count in sorted(dead_tuples.items()):
        family.add_metric([table], count)
    yield family


def tenant_backlog_family(rows: list[tuple[str | None, float, float]]) -> GaugeMetricFamily:
    """engine_tenant_backlog{tenant, status}: the TENANT_SERIES tenants with the largest
    backlogs by uid, the rest summed under OTHER_TENANTS (always present, 0 when nobody else has
    a backlog): at most TENANT_SERIES + 1 tenant label values, however many tenants."""
    family = GaugeMetricFamily(
        "engine_tenant_backlog",
        f"Deliveries in the hot queue by status of the {TENANT_SERIES} tenants with the"
        f" largest backlogs; every other tenant under tenant=\"{OTHER_TENANTS}\"",
        labels=["tenant", "status"],
    )
    other = {"pending": 0.0, "in_flight": 0.0}
    for uid, pending, in_flight in rows:
        if uid is None:
            other = {"pending": pending, "in_flight": in_flight}
            continue
        family.add_metric([uid, "pending"], pending)
        family.add_metric([uid, "in_flight"], in_flight)
    for status, count in other.items():
        family.add_metric([OTHER_TENANTS, status], count)
    return family


def render(dsn: str | None, local: Collector | None = None) -> bytes:
    """The /metrics body: every process's samples plus the database gauges (when `dsn`).
    `local` is a process's own registry (ingress keeps one), rendered only outside
    multiprocess mode: in it, its samples are already in the shared files."""
    registry = CollectorRegistry()
    folder = os.environ.get(MULTIPROC_ENV)
    if folder:
        registry.register(AttemptHistogramView(multiprocess.MultiProcessCollector(None, folder)))
    else:
        # One process (tests, tools): its instruments live in the default registry.
        instruments()
        registry.register(AttemptHistogramView(REGISTRY))
        if local is not None:
            registry.register(local)
    if dsn:
        registry.register(DatabaseCollector(dsn))
    return generate_latest(registry)

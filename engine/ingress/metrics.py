"""Ingress metrics in Prometheus text format: requests by route and status, latency, and
the shape of group commits (how many requests and events each commit carried)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from engine.observe import metrics as engine_metrics

_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


class IngressMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "engine_ingress_requests", "HTTP requests answered", ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "engine_ingress_request_seconds", "Time to answer a request", ["route"],
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.commit_requests = Histogram(
            "engine_ingress_commit_requests", "Requests written per group commit",
            buckets=_SIZE_BUCKETS, registry=self.registry,
        )
        self.commit_seconds = Histogram(
            "engine_ingress_commit_seconds", "Time to write and commit one group",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )

        # Labelled children looked up once per (route, status), not on every request.
        self._children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}

    def observe(self, route: str, status: int, seconds: float) -> None:
        children = self._children.get((route, status))
        if children is None:
            children = self._children[route, status] = (
                self.requests.labels(route, str(status)), self.latency.labels(route)
            )
        children[0].inc()
        children[1].observe(seconds)

    def observe_commit(self, requests: int, events: int, seconds: float) -> None:
        engine_metrics.instruments().ingested_events.inc(events)
        self.commit_requests.observe(requests)
        self.commit_seconds.observe(seconds)

"""OpenTelemetry: one span per delivery attempt, exported over OTLP/HTTP (SPEC,
"Deployment and tracing"; docs/decisions/0035-tracing.md).

With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, a worker
makes `AttemptTracer.from_environment()`: each attempt's span starts when its request
does, is a child of the `traceparent` its event was posted with, carries the destination,
tenant, attempt, status code, error and duration, and ends with the answer. A span is a
tuple here, formatted as OTLP's JSON and posted in batches by one thread
(engine/observe/span_export.py): the official SDK's span objects and protobuf exporter
cost 2.6 times the engine's CPU per delivery (decision 0035). A full queue or a
failed export drops spans and counts them (`engine_trace_spans_dropped_total`): an
unreachable collector never slows a delivery. Without the variable nothing is made.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import msgspec

from engine.domain import Claim, Result

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SPAN_NAME = "webhook attempt"
SAMPLED = "01"
# W3C Trace Context: version, trace id, parent id, flags, lowercase hex. Version ff is
# invalid, as are all-zero ids; a later version may append fields after the fourth.
_TRACEPARENT = re.compile(
    r"(?P<version>[0-9a-f]{2})-(?P<trace>[0-9a-f]{32})-(?P<parent>[0-9a-f]{16})"
    r"-(?P<flags>[0-9a-f]{2})(?P<rest>-.*)?")


def checked_traceparent(value: str | None) -> str | None:
    """The traceparent as stored (its first four fields), or None for a missing or
    malformed one: the event is accepted without a parent (issue 44, item 4)."""
    if value is None:
        return None
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None or match["version"] == "ff":
        return None
    if match["version"] == "00" and match["rest"] is not None:
        return None
    if match["trace"] == "0" * 32 or match["parent"] == "0" * 16:
        return None
    return "-".join((match["version"], match["trace"], match["parent"], match["flags"]))


def tracing_configured(environ: Mapping[str, str]) -> bool:
    return any(environ.get(name) for name in ENDPOINT_VARIABLES)


class Span(NamedTuple):
    """An attempt's span while its request runs: its trace (hex, the event's) or None
    for a root of its own, whose trace id is `root_trace`; its id; its parent (hex);
    when it began (unix ns)."""

    trace_id: str | None
    root_trace: int
    span_id: int
    parent_id: str | None
    start_ns: int


# An ended span as the export thread formats it (span_export.py): the span, when it
# ended, then the claim's and the result's values.
Ended = tuple[Span, int, int, int, int, int, str, int | None, str, int | None, int | None,
              str | None]


class AttemptTracer:
    """Starts and ends the spans of one worker's attempts. The event loop's part is
    minimal (two ids, two clock reads, one tuple); `export` takes the ended tuple and the
    export thread formats it (span_export.SpanQueue.add). `rng` makes the ids (a seeded
    one in tests)."""

    def __init__(self, export: Callable[[Ended], None],
                 rng: random.Random | None = None,
                 clock_ns: Callable[[], int] = time.time_ns,
                 close: Callable[[], None] | None = None) -> None:
        self.export = export
        self.getrandbits = (rng or random.Random()).getrandbits
        self.clock_ns = clock_ns
        self.close = close or (lambda: None)  # the last spans exported (the drain)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], on_drop: Callable[[int], None],
                         service: str = "engine") -> AttemptTracer | None:
        """A tracer exporting to the OTLP/HTTP endpoint the environment names, or None
        when none is named."""
        if not tracing_configured(environ):
            return None
        from engine.observe.span_export import SpanQueue

        queue = SpanQueue.from_environment(environ, on_drop,
                                           environ.get("OTEL_SERVICE_NAME", service))
        return cls(queue.add, close=queue.close)

    def start(self, claim: Claim) -> Span:
        """The attempt's span, begun now, a child of the event's traceparent (the event's
        trace), else the root of a trace of its own."""
        parent = claim.traceparent
        bits = self.getrandbits
        if parent:
            return Span(parent[3:35], 0, bits(64) or 1, parent[36:52], self.clock_ns())
        return Span(None, bits(128) or 1, bits(64) or 1, None, self.clock_ns())

    @staticmethod
    def traceparent_of(span: Span) -> str:
        """The `traceparent` a propagating destination's POST carries: the attempt's own
        span, so the receiver's work is its child."""
        trace = span.trace_id or f"{span.root_trace:032x}"
        return f"00-{trace}-{span.span_id:016x}-{SAMPLED}"

    def end(self, span: Span, claim: Claim, result: Result) -> None:
        self.export((span, self.clock_ns(), claim.id, claim.event_id, claim.destination_id,
                     claim.attempt, claim.url, claim.tenant_id, result.outcome,
                     result.status_code, result.duration_ms, result.error))


def spans_of(bodies: list[bytes]) -> list[dict[str, Any]]:
    """The spans of OTLP/HTTP JSON request bodies (the tests' and the bench's collector)."""
    return [span for body in bodies
            for resource in msgspec.json.decode(body)["resourceSpans"]
            for scope in resource["scopeSpans"] for span in scope["spans"]]

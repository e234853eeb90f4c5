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
    """The ids of an attempt's span, in hex: its trace (the event's, else one of its
    own), its own id, its parent (the event's span) or None for a root. Made on the event
    loop only when a propagating destination's POST must carry them (traceparent_of); any
    other span gets its ids in the export thread."""

    trace_id: str
    span_id: str
    parent_id: str | None


# An attempt as the event loop hands it to the export thread (span_export.py): when it
# began and ended (unix ns), its ids if the loop made them, the claim and the result.
# References only: formatting, ids and attribute values are the export thread's work.
Ended = tuple[int, int, Span | None, Claim, Result]


def span_ids(claim: Claim, getrandbits: Callable[[int], int]) -> Span:
    """An attempt's span ids: a child of the event's traceparent, else a root. (An id of
    all zeros, which W3C Trace Context forbids, has odds of 2**-64 at most.)"""
    parent = claim.traceparent
    if parent:
        return Span(parent[3:35], f"{getrandbits(64):016x}", parent[36:52])
    bits = f"{getrandbits(192):048x}"
    return Span(bits[:32], bits[32:], None)


class AttemptTracer:
    """Starts and ends the spans of one worker's attempts. The event loop's part is a
    clock read at each end and one tuple of references (ids only for a propagating
    destination); `export` takes the ended tuple and the export thread does the rest
    (span_export.SpanQueue.add). `rng` makes the ids (a seeded one in tests)."""

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

    def start(self, claim: Claim) -> tuple[int, Span | None]:
        """The attempt's span, begun now: its start, and its ids when its destination
        propagates them."""
        ids = span_ids(claim, self.getrandbits) if claim.propagate_trace else None
        return self.clock_ns(), ids

    @staticmethod
    def traceparent_of(ids: Span) -> str:
        """The `traceparent` a propagating destination's POST carries: the attempt's own
        span, so the receiver's work is its child."""
        return f"00-{ids.trace_id}-{ids.span_id}-{SAMPLED}"

    def end(self, started: tuple[int, Span | None], claim: Claim, result: Result) -> None:
        self.export((started[0], self.clock_ns(), started[1], claim, result))


def spans_of(bodies: list[bytes]) -> list[dict[str, Any]]:
    """The spans of OTLP/HTTP JSON request bodies (the tests' and the bench's collector)."""
    return [span for body in bodies
            for resource in msgspec.json.decode(body)["resourceSpans"]
            for scope in resource["scopeSpans"] for span in scope["spans"]]

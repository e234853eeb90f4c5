"""OpenTelemetry: one span per delivery attempt (SPEC, "Deployment and tracing";
docs/decisions/0035-tracing.md).

With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, a worker
makes `AttemptTracer.from_environment()`: each attempt's span starts when its request
does, is a child of the `traceparent` its event was posted with, carries the destination,
tenant, attempt, status code, error and duration, and ends with the answer. Spans go to a
bounded queue that a thread exports in batches with the official OTLP/HTTP exporter: the
event loop only appends. A full queue or a failed export drops spans and counts them
(`engine_trace_spans_dropped_total`): an unreachable collector never slows a delivery.
Without the variable nothing is imported and nothing is made.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from engine.domain import Claim, Result

if TYPE_CHECKING:  # the SDK loads only when tracing is on
    from opentelemetry.sdk.trace import Span, SpanProcessor

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SPAN_NAME = "webhook attempt"
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


class AttemptTracer:
    """Starts and ends the spans of one worker's attempts."""

    def __init__(self, processor: SpanProcessor, service: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )

        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("engine")
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], on_drop: Callable[[int], None],
                         service: str = "engine") -> AttemptTracer | None:
        """A tracer exporting to the OTLP/HTTP endpoint the environment names (the
        exporter reads OTEL_EXPORTER_OTLP_* itself), or None when none is named."""
        if not tracing_configured(environ):
            return None
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        from engine.observe.span_export import QueuedExport

        return cls(QueuedExport(OTLPSpanExporter(), on_drop),
                   environ.get("OTEL_SERVICE_NAME", service))

    def start(self, claim: Claim) -> Span:
        """The attempt's span, begun now, a child of the event's traceparent."""
        parent = (self.propagator.extract({"traceparent": claim.traceparent})
                  if claim.traceparent else None)
        attributes: dict[str, Any] = {
            "engine.delivery_id": claim.id, "engine.event_id": claim.event_id,
            "engine.destination_id": claim.destination_id,
            "engine.attempt": claim.attempt, "url.full": claim.url,
        }
        if claim.tenant_id is not None:
            attributes["engine.tenant_id"] = claim.tenant_id
        from opentelemetry.trace import SpanKind

        return self.tracer.start_span(SPAN_NAME, context=parent, kind=SpanKind.CLIENT,
                                      attributes=attributes)  # type: ignore[return-value]

    def traceparent_of(self, span: Span) -> str:
        """The `traceparent` header a propagating destination's POST carries: the
        attempt's own span, so the receiver's work is its child."""
        context = span.get_span_context()
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"

    def end(self, span: Span, result: Result) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("engine.outcome", result.outcome)
        if result.status_code is not None:
            span.set_attribute("http.response.status_code", result.status_code)
        if result.duration_ms is not None:
            span.set_attribute("engine.duration_ms", result.duration_ms)
        if result.error:
            span.set_attribute("error.type", result.error)
        if result.outcome != "delivered":
            span.set_status(Status(StatusCode.ERROR, result.error or result.outcome))
        span.end(end_time=time.time_ns())

    def shutdown(self) -> None:
        self.provider.shutdown()


def exported_spans(requests: Sequence[bytes]) -> list[Any]:
    """The spans of OTLP/HTTP protobuf request bodies (for tests and the bench's sink)."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    spans = []
    for body in requests:
        message = trace_service_pb2.ExportTraceServiceRequest()
        message.ParseFromString(body)
        for resource in message.resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
    return spans

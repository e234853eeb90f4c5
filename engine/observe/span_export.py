"""The export side of attempt spans (engine/observe/tracing.py; docs/decisions/0035): a
bounded queue the event loop appends to, and one thread that posts it in batches to the
collector as OTLP/HTTP JSON (`POST {endpoint}/v1/traces`, the protocol's own JSON
encoding). A span the queue has no room for, or a batch the collector does not take
(refused, failed, timed out), is dropped and counted: nothing waits for the collector.
"""

from __future__ import annotations

import http.client
import random
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec

from engine.domain import Claim, Result
from engine.observe.tracing import SPAN_NAME, Ended

QUEUE_LIMIT = 20_000  # spans waiting for export; beyond it they are dropped and counted
BATCH_LIMIT = 2_000
EXPORT_INTERVAL_S = 1.0
DEFAULT_TIMEOUT_S = 10.0  # OTEL_EXPORTER_OTLP_TIMEOUT's default (the spec says 10 s)
# Per destination, the attributes its spans share, formatted once (bounded: cleared when
# it grows past this many destinations).
SHARED_LIMIT = 10_000
_encode = msgspec.json.Encoder().encode


def _text(value: str) -> str:
    """A JSON string literal (escaped)."""
    return _encode(value).decode()


class SpanFormat:
    """Formats ended attempts as OTLP/JSON spans in the export thread (ids in hex, 64-bit
    integers as text; kind 3 is CLIENT, status code 2 is ERROR), a batch at a time. A
    span the loop made no ids for (its destination does not propagate them) gets them
    here, from one draw of `rng` per batch. What spans share is formatted once: a
    destination's attributes, and an outcome's with its status code (when no error text
    goes with it). The tracing bar is 10 % of the engine's CPU per delivery (issue 44):
    formatting a span costs about as much as building one in Python at all."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.randbytes = (rng or random.Random()).randbytes
        self.shared: dict[tuple[int, str], str] = {}
        self.outcomes: dict[tuple[str, int | None], str] = {}

    def destination_part(self, claim: Claim) -> str:
        part = self.shared.get((claim.destination_id, claim.url))
        if part is None:
            if len(self.shared) >= SHARED_LIMIT:
                self.shared.clear()
            tenant = ("" if claim.tenant_id is None else
                      f'{{"key":"engine.tenant_id","value":{{"intValue":"{claim.tenant_id}"}}}},')
            part = self.shared[(claim.destination_id, claim.url)] = (
                f'{{"key":"engine.destination_id","value":{{"intValue":"{claim.destination_id}"}}}},'
                f'{{"key":"url.full","value":{{"stringValue":{_text(claim.url)}}}}},{tenant}')
        return part

    def outcome_part(self, result: Result) -> str:
        """The span's last attributes, closed, and its status: cached per outcome and
        status code unless an error text goes with them."""
        outcome, status, error = result.outcome, result.status_code, result.error
        if not error:
            part = self.outcomes.get((outcome, status))
            if part is not None:
                return part
        part = f',{{"key":"engine.outcome","value":{{"stringValue":"{outcome}"}}}}'
        if status is not None:
            part += f',{{"key":"http.response.status_code","value":{{"intValue":"{status}"}}}}'
        if error:
            part += f',{{"key":"error.type","value":{{"stringValue":{_text(error)}}}}}'
        if outcome != "delivered":
            part += f'],"status":{{"code":2,"message":{_text(error or outcome)}}}'
        else:
            part += "]"
        if not error and len(self.outcomes) < SHARED_LIMIT:
            self.outcomes[(outcome, status)] = part
        return part

    def spans_json(self, spans: list[Ended]) -> str:
        """The spans' OTLP/JSON, joined by commas."""
        fresh = self.randbytes(24 * len(spans)).hex()  # 32 hex of trace, 16 of span, each
        destination_part, outcome_part = self.destination_part, self.outcome_part
        out: list[str] = []
        append = out.append
        for k, (start_ns, end_ns, ids, claim, result) in enumerate(spans):
            at = 48 * k
            if ids is not None:
                trace, span = ids.trace_id, ids.span_id
                parent = f'"parentSpanId":"{ids.parent_id}",' if ids.parent_id else ""
            elif claim.traceparent:
                trace, span = claim.traceparent[3:35], fresh[at + 32:at + 48]
                parent = f'"parentSpanId":"{claim.traceparent[36:52]}",'
            else:
                trace, span, parent = fresh[at:at + 32], fresh[at + 32:at + 48], ""
            duration = result.duration_ms
            append(
                f'{{"traceId":"{trace}","spanId":"{span}",{parent}'
                f'"name":"{SPAN_NAME}","kind":3,"startTimeUnixNano":"{start_ns}",'
                f'"endTimeUnixNano":"{end_ns}","attributes":['
                f'{{"key":"engine.delivery_id","value":{{"intValue":"{claim.id}"}}}},'
                f'{{"key":"engine.event_id","value":{{"intValue":"{claim.event_id}"}}}},'
                f'{destination_part(claim)}'
                f'{{"key":"engine.attempt","value":{{"intValue":"{claim.attempt}"}}}}'
                + ("" if duration is None else
                   f',{{"key":"engine.duration_ms","value":{{"intValue":"{duration}"}}}}')
                + f'{outcome_part(result)}}}')
        return ",".join(out)


def traces_url(environ: Mapping[str, str]) -> str:
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as given, else OTEL_EXPORTER_OTLP_ENDPOINT with
    /v1/traces appended (the OTLP exporter specification)."""
    signal = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if signal:
        return signal
    return environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"


def export_headers(environ: Mapping[str, str]) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_HEADERS (`key=value,key2=value2`) and the content type."""
    headers = {"Content-Type": "application/json"}
    for pair in environ.get("OTEL_EXPORTER_OTLP_HEADERS", "").split(","):
        key, _, value = pair.partition("=")
        if key.strip() and value:
            headers[key.strip()] = value.strip()
    return headers


class SpanQueue:
    def __init__(self, url: str, headers: dict[str, str], service: str,
                 on_drop: Callable[[int], None], timeout_s: float = DEFAULT_TIMEOUT_S,
                 limit: int = QUEUE_LIMIT, interval_s: float = EXPORT_INTERVAL_S) -> None:
        where = urlsplit(url)
        if where.scheme not in ("http", "https") or not where.hostname:
            raise ValueError(f"OTLP traces endpoint must be an http(s) URL, got {url!r}")
        self.where = where
        self.headers = headers
        self.head = ('{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name",'
                     f'"value":{{"stringValue":{_text(service)}}}}}]}},"scopeSpans":['
                     '{"scope":{"name":"engine"},"spans":[')
        self.on_drop = on_drop
        self.timeout_s = timeout_s
        self.limit = limit
        self.interval_s = interval_s
        self.queue: deque[Ended] = deque()
        self.format = SpanFormat()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="span export", daemon=True)
        self.thread.start()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], on_drop: Callable[[int], None],
                         service: str) -> SpanQueue:
        timeout = environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")
        # The specification's unit is milliseconds; a value under 100 reads as seconds,
        # as the Python SDK took it before 1.27.
        timeout_s = (float(timeout) / (1000 if float(timeout) >= 100 else 1)
                     if timeout else DEFAULT_TIMEOUT_S)
        return cls(traces_url(environ), export_headers(environ), service, on_drop,
                   timeout_s)

    def add(self, span: Ended) -> None:
        """From the event loop: O(1), never blocks."""
        if len(self.queue) >= self.limit:
            self.on_drop(1)
            return
        self.queue.append(span)

    def close(self) -> None:
        """Export what is queued, then stop (the worker's drain)."""
        self.stopping.set()
        self.thread.join(self.interval_s + self.timeout_s + 5)

    def _run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            self.export_queued()
        self.export_queued()

    def export_queued(self) -> None:
        queue = self.queue
        while queue:
            batch: list[Ended] = []
            while queue and len(batch) < BATCH_LIMIT:
                batch.append(queue.popleft())
            if not self._post(batch):
                self.on_drop(len(batch))

    def _post(self, spans: list[Ended]) -> bool:
        body = (self.head + self.format.spans_json(spans) + "]}]}]}").encode()
        where = self.where
        kind: Any = (http.client.HTTPSConnection if where.scheme == "https"
                     else http.client.HTTPConnection)
        conn = kind(where.hostname, where.port, timeout=self.timeout_s)
        try:
            conn.request("POST", where.path or "/", body, self.headers)
            response = conn.getresponse()
            response.read()
            return 200 <= response.status < 300
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

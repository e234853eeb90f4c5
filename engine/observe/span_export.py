"""The export side of attempt spans (engine/observe/tracing.py; docs/decisions/0035): a
bounded queue the event loop appends to, and one thread that posts it in batches to the
collector as OTLP/HTTP JSON (`POST {endpoint}/v1/traces`, the protocol's own JSON
encoding). A span the queue has no room for, or a batch the collector does not take
(refused, failed, timed out), is dropped and counted: nothing waits for the collector.
"""

from __future__ import annotations

import http.client
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec

from engine.observe.tracing import SPAN_NAME, Ended

QUEUE_LIMIT = 20_000  # spans waiting for export; beyond it they are dropped and counted
BATCH_LIMIT = 2_000
EXPORT_INTERVAL_S = 1.0
DEFAULT_TIMEOUT_S = 10.0  # OTEL_EXPORTER_OTLP_TIMEOUT's default (the spec says 10 s)
_encode = msgspec.json.Encoder().encode
def span_json(ended: Ended) -> str:
    """One ended attempt as an OTLP/JSON span (ids in hex, 64-bit integers as text;
    kind 3 is CLIENT, status code 2 is ERROR)."""
    (span, end_ns, delivery, event, destination, attempt, url, tenant, outcome, status,
     duration_ms, error) = ended
    trace = span.trace_id or f"{span.root_trace:032x}"
    parent = f'"parentSpanId":"{span.parent_id}",' if span.parent_id else ""
    extra = ""
    if tenant is not None:
        extra += f',{{"key":"engine.tenant_id","value":{{"intValue":"{tenant}"}}}}'
    if status is not None:
        extra += f',{{"key":"http.response.status_code","value":{{"intValue":"{status}"}}}}'
    if duration_ms is not None:
        extra += f',{{"key":"engine.duration_ms","value":{{"intValue":"{duration_ms}"}}}}'
    if error:
        extra += f',{{"key":"error.type","value":{{"stringValue":{_text(error)}}}}}'
    state = ""
    if outcome != "delivered":
        state = f',"status":{{"code":2,"message":{_text(error or outcome)}}}'
    return (
        f'{{"traceId":"{trace}","spanId":"{span.span_id:016x}",{parent}'
        f'"name":"{SPAN_NAME}","kind":3,'
        f'"startTimeUnixNano":"{span.start_ns}","endTimeUnixNano":"{end_ns}","attributes":['
        f'{{"key":"engine.delivery_id","value":{{"intValue":"{delivery}"}}}},'
        f'{{"key":"engine.event_id","value":{{"intValue":"{event}"}}}},'
        f'{{"key":"engine.destination_id","value":{{"intValue":"{destination}"}}}},'
        f'{{"key":"engine.attempt","value":{{"intValue":"{attempt}"}}}},'
        f'{{"key":"url.full","value":{{"stringValue":{_text(url)}}}}},'
        f'{{"key":"engine.outcome","value":{{"stringValue":"{outcome}"}}}}{extra}]{state}}}')


def _text(value: str) -> str:
    """A JSON string literal (escaped)."""
    return _encode(value).decode()


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
        body = (self.head + ",".join(map(span_json, spans)) + "]}]}]}").encode()
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

"""OpenTelemetry spans of delivery attempts (issue 44 item 3, 4; SPEC, "Deployment and
tracing"): through a running engine to a local OTLP/HTTP receiver that decodes what
arrives. A span per attempt, a child of the traceparent the event was posted with,
carrying the destination, tenant, attempt, status code and error; `propagate_trace`
sends the attempt's own traceparent; a malformed traceparent is ignored; an unreachable
collector slows and fails nothing, and its spans are counted as dropped in /metrics."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.observe.tracing import checked_traceparent, spans_of
from engine.testing.ingress_server import IngressProcess
from tests.kit.data import add_destination
from tests.kit.enginerun import Engine, wait_until
from tests.kit.httpserver_helpers import closed_port

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
WAIT_S = 60


class _Collect(BaseHTTPRequestHandler):
    """POST /v1/traces (the collector: protobuf bodies kept), POST /ok and /fail (the
    destinations: their headers kept)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        server: Any = self.server
        if self.path == "/v1/traces":
            server.exports.append(body)
            status = 200
        else:
            server.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            status = 200 if self.path.startswith("/ok") else 500
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def collector() -> Iterator[Any]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), _Collect)
    server.exports, server.requests = [], []
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    server.base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def api_of(engine: Engine) -> IngressProcess:
    [started] = wait_until(lambda: engine.events("supervisor_started"), WAIT_S, "supervisor")
    api = IngressProcess("unused")
    api.port = int(started["bind"].rsplit(":", 1)[1])
    wait_until(lambda: _healthy(api), WAIT_S, "/healthz")
    return api


def _healthy(api: IngressProcess) -> bool:
    try:
        return api.request("GET", "/healthz", timeout=2).status == 200
    except OSError:
        return False


def attributes(span: dict[str, Any]) -> dict[str, Any]:
    """A span's attributes as Python values (OTLP/JSON sends 64-bit integers as text)."""
    found: dict[str, Any] = {}
    for item in span["attributes"]:
        [(kind, value)] = item["value"].items()
        found[item["key"]] = int(value) if kind == "intValue" else value
    return found


def as_otlp_messages(bodies: list[bytes]) -> list[Any]:
    """Each body read by OTLP's own message definitions (opentelemetry-proto): OTLP/JSON
    is protobuf's JSON mapping but for the ids, which are hex instead of base64."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    messages = []
    for body in bodies:
        document = json.loads(body)
        for resource in document["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in span:
                            span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
        messages.append(json_format.ParseDict(
            document, trace_service_pb2.ExportTraceServiceRequest()))
    return messages


def test_an_attempt_span_is_the_child_of_the_events_traceparent(
        dsn: str, tmp_path: Path, collector: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.base)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "engine-test")
    with psycopg.connect(dsn, autocommit=True) as conn:
        propagating = add_destination(conn, url=f"{collector.base}/ok/propagating",
                                      propagate_trace=True)
        failing = add_destination(conn, url=f"{collector.base}/fail")
        with Engine(dsn, tmp_path, "--procs", "1", "--bind", "127.0.0.1:0",
                    "--allow-private-targets", "--retry-schedule", "1h") as engine:
            api = api_of(engine)
            traced = api.request("POST", "/v1/events", {
                "type": "order.paid", "payload": {"n": 1},
                "destination_ids": [propagating, failing]},
                headers={"traceparent": TRACEPARENT})
            assert traced.status == 202, traced
            # A malformed traceparent is ignored: accepted, no parent recorded.
            plain = api.request("POST", "/v1/events", {
                "type": "order.paid", "payload": {"n": 2}, "destination_ids": [propagating]},
                headers={"traceparent": "00-nothex-00f067aa0ba902b7-01"})
            assert plain.status == 202, plain
            stored = dict(conn.execute("SELECT id, traceparent FROM events").fetchall())
            assert stored == {traced.json()["id"]: TRACEPARENT, plain.json()["id"]: None}
            spans = wait_until(lambda: (lambda got: got if len(got) >= 3 else None)(
                spans_of(collector.exports)), WAIT_S, "three attempt spans")
            engine.assert_no_callback_raised()
    by_event = {}
    for span in spans:
        found = attributes(span)
        by_event.setdefault(found["engine.event_id"], []).append((span, found))
    child_spans = by_event[traced.json()["id"]]
    assert len(child_spans) == 2
    for span, found in child_spans:
        assert (span["traceId"], span["parentSpanId"]) == (TRACE_ID, PARENT_ID)
        assert found["engine.tenant_id"] == 1 and found["engine.attempt"] == 1
    outcomes = {found["engine.destination_id"]: found for _, found in child_spans}
    assert outcomes[propagating]["http.response.status_code"] == 200
    assert outcomes[failing]["http.response.status_code"] == 500
    assert outcomes[failing]["engine.outcome"] == "retry"
    [(root, _)] = by_event[plain.json()["id"]]
    assert "parentSpanId" not in root and root["traceId"] != TRACE_ID
    failed = next(span for span, found in child_spans
                  if found["engine.destination_id"] == failing)
    assert failed["status"]["code"] == 2  # ERROR
    # What arrived is OTLP by its own definitions: every span read back whole.
    messages = as_otlp_messages(collector.exports)
    read = [span for message in messages for resource in message.resource_spans
            for scope in resource.scope_spans for span in scope.spans]
    assert len(read) == len(spans)
    assert {span.parent_span_id.hex() for span in read} == {PARENT_ID, ""}
    # The propagating destination got the attempt's own span as its parent.
    sent = {headers["traceparent"].rsplit("-", 1)[0] for path, headers in collector.requests
            if path == "/ok/propagating"}
    expected = {f"00-{span['traceId']}-{span['spanId']}"
                for span, found in [*child_spans, *[(root, attributes(root))]]
                if found["engine.destination_id"] == propagating}
    assert sent == expected
    assert all("traceparent" not in headers for path, headers in collector.requests
               if path == "/fail")


def test_an_unreachable_collector_slows_nothing_and_its_spans_are_counted(
        dsn: str, tmp_path: Path, collector: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    events = 50
    with psycopg.connect(dsn, autocommit=True) as conn:
        destination = add_destination(conn, url=f"{collector.base}/ok/plain")
        with Engine(dsn, tmp_path, "--procs", "1", "--bind", "127.0.0.1:0",
                    "--allow-private-targets") as engine:
            api = api_of(engine)
            answer = api.request("POST", "/v1/events/batch", {"events": [
                {"type": "t", "payload": {"n": n}, "destination_ids": [destination]}
                for n in range(events)]}, headers={"traceparent": TRACEPARENT})
            assert answer.status == 202, answer
            wait_until(lambda: len(collector.requests) >= events, WAIT_S, "the deliveries")

            def dropped() -> float:
                text = api.request("GET", "/metrics").body.decode()
                return sum(float(line.split()[-1]) for line in text.splitlines()
                           if line.startswith("engine_trace_spans_dropped_total"))

            assert wait_until(lambda: dropped() >= events, WAIT_S, "the dropped spans")


@given(st.text(max_size=80))
def test_only_a_well_formed_traceparent_is_kept(text: str) -> None:
    kept = checked_traceparent(text)
    assert kept is None or (len(kept) == 55 and kept == kept.lower())


@pytest.mark.parametrize(("given_value", "kept"), [
    (TRACEPARENT, TRACEPARENT),
    (f" {TRACEPARENT} ", TRACEPARENT),
    (f"00-{TRACE_ID.upper()}-{PARENT_ID}-01", None),  # hex is lowercase
    (f"00-{'0' * 32}-{PARENT_ID}-01", None),
    (f"00-{TRACE_ID}-{'0' * 16}-01", None),
    (f"ff-{TRACE_ID}-{PARENT_ID}-01", None),
    (f"00-{TRACE_ID}-{PARENT_ID}-01-extra", None),  # version 00 has four fields
    (f"01-{TRACE_ID}-{PARENT_ID}-01-extra", f"01-{TRACE_ID}-{PARENT_ID}-01"),
    ("", None), (None, None),
])
def test_traceparent_forms(given_value: str | None, kept: str | None) -> None:
    assert checked_traceparent(given_value) == kept

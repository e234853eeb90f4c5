"""The export side of attempt spans (engine/observe/tracing.py; docs/decisions/0035):
a bounded queue the event loop appends to and one thread that exports it in batches.
Imported only when tracing is on."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

QUEUE_LIMIT = 20_000  # spans waiting for export; beyond it they are dropped and counted
BATCH_LIMIT = 512
EXPORT_INTERVAL_S = 1.0


class QueuedExport(SpanProcessor):
    """A span processor with a bounded queue and one export thread. The SDK's
    BatchSpanProcessor drops silently when its queue is full; this one counts every span
    it drops (`on_drop`), full queue or failed export alike."""

    def __init__(self, exporter: SpanExporter, on_drop: Callable[[int], None],
                 limit: int = QUEUE_LIMIT, interval_s: float = EXPORT_INTERVAL_S) -> None:
        self.exporter = exporter
        self.on_drop = on_drop
        self.limit = limit
        self.interval_s = interval_s
        self.queue: deque[ReadableSpan] = deque()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="span export", daemon=True)
        self.thread.start()

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if len(self.queue) >= self.limit:
            self.on_drop(1)
            return
        self.queue.append(span)

    def shutdown(self) -> None:
        self.stopping.set()
        self.thread.join(self.interval_s + 10)
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        self._export_all()
        return True

    def _run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            self._export_all()
        self._export_all()

    def _export_all(self) -> None:
        while self.queue:
            batch: list[ReadableSpan] = []
            while self.queue and len(batch) < BATCH_LIMIT:
                batch.append(self.queue.popleft())
            try:
                exported = self.exporter.export(batch) == SpanExportResult.SUCCESS
            except Exception:  # the exporter's own failure is a dropped batch, not a crash
                exported = False
            if not exported:
                self.on_drop(len(batch))

"""A throwaway embedded PostgreSQL 18 in a temporary folder, for the test suite (tuned for
speed) and the benchmarks (durable: fsync and synchronous_commit on)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.db.embedded import ensure_server


@contextmanager
def throwaway_server(*, durable: bool, prefix: str) -> Iterator[str]:
    """Yield the admin DSN of a server started in a new temporary folder whose name
    starts with `prefix`; the server is stopped and the folder deleted afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    server = ensure_server(folder / "data", durable=durable)
    try:
        yield server.dsn
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)

"""The engine as the delivery tests run it: short retries so a test sees several attempts,
and a breaker that never opens unless a test asks for it (breaker behaviour has its own
tests; the `config` fixture in tests/conftest.py writes that setting)."""

from __future__ import annotations

from pathlib import Path

from tests.kit.enginerun import Engine

SCHEDULE = "200ms," * 8 + "200ms"
MAX_ATTEMPTS = 10  # flaky/30 fails all ten for one delivery in 170,000


def engine(dsn: str, tmp_path: Path, config: Path, *args: str) -> Engine:
    return Engine(
        dsn, tmp_path, "--config", str(config), "--allow-private-targets",
        "--retry-schedule", SCHEDULE, "--bind", "127.0.0.1:0", *args,
    )

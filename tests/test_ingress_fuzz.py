"""Property-based tests of the ingress API: schemathesis fuzzes every operation from the
server's own /openapi.json (no 5xx, answers match the schema), and hypothesis throws bad
bodies at POST /v1/events (each is refused with a 4xx and writes nothing)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ingress_server import IngressProcess

TOKEN = "fuzz-token"
SCHEMATHESIS_EXAMPLES = 30


@pytest.fixture(scope="module")
def server(module_dsn: str) -> Iterator[IngressProcess]:
    with IngressProcess(module_dsn, token=TOKEN) as process:
        created = process.request("POST", "/v1/destinations", {"url": "http://127.0.0.1:9/x"})
        assert created.status == 201
        yield process


def test_schemathesis_finds_no_server_error_or_schema_violation(
    server: IngressProcess, tmp_path: object
) -> None:
    command = shutil.which("schemathesis")
    if command is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[test]')")
    result = subprocess.run(
        [
            command, "run", f"{server.base_url}/openapi.json",
            "-H", f"Authorization: Bearer {TOKEN}",
            # Semantic checks (unknown destination ids, refused URLs) are 422 by design.
            "--exclude-checks", "positive_data_acceptance",
            "--max-examples", str(SCHEMATHESIS_EXAMPLES),
            "--workers", "2", "--seed", "1", "--request-timeout", "20",
        ],
        capture_output=True, text=True, timeout=240, cwd=str(tmp_path),
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]


def _json_values() -> st.SearchStrategy[object]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=12,
    )


_FIELDS = st.sampled_from(["type", "payload", "destination_ids", "ordering_key", "extra"])

bodies = st.one_of(
    st.binary(max_size=200),
    _json_values().map(lambda v: json.dumps(v).encode()),
    # Objects with the right field names and arbitrary values: mostly wrong types.
    st.dictionaries(_FIELDS, _json_values(), max_size=5).map(lambda v: json.dumps(v).encode()),
    # Valid JSON around bytes that are not UTF-8.
    st.binary(min_size=1, max_size=20).filter(lambda b: not _is_utf8(b)).map(
        lambda b: b'{"type": "t", "payload": "' + b + b'"}'
    ),
)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _count_events(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM events").fetchone()
    assert row is not None
    return int(row[0])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies)
def test_random_bodies_are_refused_without_writing_or_accepted_once(
    server: IngressProcess, module_dsn: str, body: bytes
) -> None:
    before = _count_events(module_dsn)
    answer = server.request("POST", "/v1/events", raw=body)
    assert answer.status in (202, 400, 422), answer
    written = _count_events(module_dsn) - before
    if answer.status == 202:
        assert written == 1
    else:
        assert set(answer.json()["error"]) == {"code", "message"}
        assert written == 0

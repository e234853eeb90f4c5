"""--allow-targets CIDR[,CIDR...]: the listed private ranges are permitted at creation and
at connect time, and every other refusal stays. Loopback ranges only: 127.0.0.0/8 allowed,
::1, localhost, other private ranges and embeddings of the allowed ones still refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from engine.testing.fakedest import FakeDestination
from engine.testing.ingress_server import IngressProcess
from engine.webhooks.targets import TargetRefused, parse_allowed_networks, validate_url
from engine.worker.http.client import CurlPool, HttpResult
from tests.kit.data import add_destination, enqueue, finished
from tests.kit.enginerun import ROOT, Engine, wait_until
from tests.kit.httpserver_helpers import ScriptedServer
from tests.kit.workers import SCHEDULE
from tests.test_http_client import HEADERS, run, server  # noqa: F401

LOOPBACK_V4 = parse_allowed_networks("127.0.0.0/8")


@pytest.mark.parametrize(("url", "normalised"), [
    ("http://127.0.0.1:8080/hook", "http://127.0.0.1:8080/hook"),
    ("http://127.9.8.7/", "http://127.9.8.7/"),
    ("http://127.1:8080/", "http://127.0.0.1:8080/"),  # numeric forms are read as curl does
    ("https://hooks.example.com/", "https://hooks.example.com/"),  # public stays allowed
])
def test_listed_ranges_are_permitted_at_creation(url: str, normalised: str) -> None:
    assert validate_url(url, LOOPBACK_V4) == normalised


@pytest.mark.parametrize("url", [
    "http://[::1]:8080/",  # loopback, but not a listed range
    "http://localhost:8080/",  # a loopback name: refused by name
    "http://10.0.0.1/",
    "http://192.168.1.1/",
    "http://169.254.169.254/",
    "http://0.0.0.0/",
    "http://[::ffff:127.0.0.1]/",  # an embedding of an allowed address is not the range
    "http://u:p@127.0.0.1/",  # every other rule still applies
])
def test_everything_else_keeps_its_refusal(url: str) -> None:
    with pytest.raises(TargetRefused):
        validate_url(url, LOOPBACK_V4)


@pytest.mark.parametrize(("text", "mentions"), [
    ("127.0.0.1/8", "has host bits set"), ("nonsense", "nonsense"), (" , ", "at least one"),
])
def test_a_bad_list_is_one_clear_error(text: str, mentions: str) -> None:
    with pytest.raises(ValueError, match=mentions):
        parse_allowed_networks(text)
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", "--allow-targets", text, "migrate"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("engine: allow_targets:") and "Traceback" not in done.stderr


def test_connect_time_check_permits_only_the_listed_ranges(
    server: ScriptedServer, run  # noqa: F811
) -> None:
    port = server.server_address[1]

    async def both(pool: CurlPool) -> tuple[HttpResult, HttpResult, HttpResult]:
        allowed = await pool.post_checked(
            f"http://127.0.0.1:{port}/ok", HEADERS, b"{}", 5000, LOOPBACK_V4)
        v6 = await pool.post_checked(f"http://[::1]:{port}/ok", HEADERS, b"{}", 5000,
                                     LOOPBACK_V4)
        by_name = await pool.post_checked(f"http://localhost:{port}/ok", HEADERS, b"{}",
                                          5000, LOOPBACK_V4)
        return allowed, v6, by_name

    allowed, v6, by_name = run(both)
    assert allowed.ok, allowed.error
    assert v6.error == "refused_target" and by_name.error == "refused_target"
    assert len(server.requests) == 1


def test_engine_and_api_with_an_allow_list(
    conn: psycopg.Connection, dsn: str, tmp_path: Path
) -> None:
    with FakeDestination() as fake:
        api = IngressProcess(dsn)
        # Not --allow-private-targets: only the listed range.
        api.argv = [arg for arg in api.argv if arg != "--allow-private-targets"]
        api.argv += ["--allow-targets", "127.0.0.0/8"]
        with api:
            created = api.request("POST", "/v1/destinations", {"url": fake.url("fast/ok")})
            assert created.status == 201, created
            refused = api.request("POST", "/v1/destinations",
                                  {"url": f"http://[::1]:{fake.port}/fast/v6"})
            assert refused.status == 422 and "url" in refused.json()["error"]["message"]
        # A row that slipped past creation (written directly) is refused at connect time.
        v6 = add_destination(conn, url=f"http://[::1]:{fake.port}/fast/v6")
        enqueue(conn, ['{"n": 1}'], [created.json()["id"]])
        enqueue(conn, ['{"n": 2}'], [v6])
        config = tmp_path / "engine.toml"
        config.write_text("breaker_threshold = 1000\n")
        with Engine(dsn, tmp_path, "--config", str(config), "--allow-targets", "127.0.0.0/8",
                    "--retry-schedule", SCHEDULE, "--bind", "127.0.0.1:0", "--procs", "1"):
            wait_until(lambda: finished(conn, created.json()["id"]) == 1, 30, "delivered")
            wait_until(lambda: finished(conn, v6, "dead") == 1, 30, "refused until dead")
        errors = {row[0] for row in conn.execute(
            "SELECT a.error FROM delivery_attempts a JOIN finished_deliveries f"
            " ON f.id = a.delivery_id WHERE f.destination_id = %s", [v6])}
        assert errors == {"refused_target"}
        assert fake.name_stats("v6") == {}

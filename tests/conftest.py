"""Shared fixtures: one PostgreSQL server per session, a fresh database per test. The CI
rule that nothing skips silently is the plugin tests/kit/ci_rules.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings

from engine.testing.ingress_server import IngressProcess
from tests.kit.dbserver import DatabaseFactory, test_server, truncate_all

# No per-example deadline (hypothesis's default is 200 ms): tests assert behaviour, not
# timings, and a loaded 2-core machine takes longer than that for an example that builds
# a few prometheus registries (issue 19). A test's own @settings still wins.
settings.register_profile("engine", deadline=None)
settings.load_profile("engine")

pytest_plugins = ["tests.kit.ci_rules", "pytester"]


@pytest.fixture(scope="session")
def database_factory() -> Iterator[DatabaseFactory]:
    with test_server() as admin_dsn:
        check_server_major(admin_dsn)
        factory = DatabaseFactory(admin_dsn)
        try:
            yield factory
        finally:
            factory.drop_all()


def check_server_major(admin_dsn: str) -> None:
    """ENGINE_TEST_PG_MAJOR (set by tools/with-pg15.sh) is the server major version the run
    must be on: a run meant for PostgreSQL 15 that reached another server fails."""
    wanted = os.environ.get("ENGINE_TEST_PG_MAJOR")
    if not wanted:
        return
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
    assert row is not None
    if row[0] // 10000 != int(wanted):
        pytest.exit(f"ENGINE_TEST_PG_MAJOR={wanted}, but the server's server_version_num is "
                    f"{row[0]}", returncode=1)


@pytest.fixture
def dsn(database_factory: DatabaseFactory) -> Iterator[str]:
    """A freshly migrated, empty database for this test."""
    url = database_factory.create()
    yield url
    database_factory.drop(url)


@pytest.fixture(scope="module")
def module_dsn(database_factory: DatabaseFactory) -> Iterator[str]:
    """One database shared by a module's tests (for servers started once per module)."""
    url = database_factory.create()
    yield url
    database_factory.drop(url)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """An engine config whose breaker never opens unless a test asks (tests/kit/workers)."""
    path = tmp_path / "engine.toml"
    path.write_text("breaker_threshold = 1000\n")
    return path


# The ingress API tests: one ingress process per module, an emptied database per test.


@pytest.fixture(scope="module")
def ingress_token() -> str | None:
    """The API token the module's ingress process requires (a module overrides it)."""
    return None


@pytest.fixture(scope="module")
def server(module_dsn: str, ingress_token: str | None) -> Iterator[IngressProcess]:
    with IngressProcess(module_dsn, token=ingress_token) as process:
        yield process


@pytest.fixture
def api(server: IngressProcess, module_dsn: str) -> Iterator[IngressProcess]:
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        truncate_all(conn)
    yield server


@pytest.fixture
def db(module_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        yield conn

"""Shared fixtures: one PostgreSQL server per session, a fresh database per test."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.dbserver import DatabaseFactory, test_server


@pytest.fixture(scope="session")
def database_factory() -> Iterator[DatabaseFactory]:
    with test_server() as admin_dsn:
        factory = DatabaseFactory(admin_dsn)
        try:
            yield factory
        finally:
            factory.drop_all()


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

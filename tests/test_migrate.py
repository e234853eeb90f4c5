"""The migrator against real, empty databases: once per file, under a lock, all or nothing
per file, and never on a database newer than the code."""

from __future__ import annotations

import itertools
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from engine.cli import main
from engine.db.migrate import SCHEMA_DIR, SchemaTooNew, load_migrations, migrate, schema_version
from tests.kit.dbserver import DatabaseFactory, with_database

pytestmark = pytest.mark.pg_versions

_names = itertools.count(1)


@pytest.fixture
def empty_dsn(database_factory: DatabaseFactory) -> Iterator[str]:
    """A database with nothing in it: not cloned from the migrated template."""
    name = f"{database_factory.prefix}_empty_{next(_names)}"
    ident = sql.Identifier(name)
    with psycopg.connect(database_factory.admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    yield with_database(database_factory.admin_dsn, name)
    with psycopg.connect(database_factory.admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


def applied_rows(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        return [
            (int(v), str(n))
            for v, n in conn.execute("SELECT version, name FROM schema_migrations ORDER BY 1")
        ]


def table_exists(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


def schema_with(tmp_path: Path, files: dict[str, str]) -> Path:
    """A schema folder holding the real migrations plus `files`."""
    folder = tmp_path / "schema"
    shutil.copytree(SCHEMA_DIR, folder)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def next_number() -> int:
    return len(load_migrations()) + 1


def test_migrate_twice_is_a_no_op(empty_dsn: str) -> None:
    every = [m.name for m in load_migrations()]
    assert schema_version(empty_dsn) == (0, None)
    assert migrate(empty_dsn) == every
    assert migrate(empty_dsn) == []
    assert applied_rows(empty_dsn) == [(i + 1, name) for i, name in enumerate(every)]
    assert schema_version(empty_dsn) == (len(every), every[-1])
    assert table_exists(empty_dsn, "deliveries")


def test_concurrent_migrators_apply_each_file_once(empty_dsn: str, tmp_path: Path) -> None:
    # A slow last file keeps the first migrator inside the lock while the others arrive.
    n = next_number()
    folder = schema_with(tmp_path, {
        f"{n:03d}_slow.sql": "SELECT pg_sleep(0.3); CREATE TABLE slow_marker (id int);"
    })
    names = [m.name for m in load_migrations(folder)]
    migrators = 6
    start = threading.Barrier(migrators)
    answers: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        start.wait()
        try:
            answers.append(migrate(empty_dsn, folder))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(migrators)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert sorted(answers, key=len) == [[]] * (migrators - 1) + [names]
    assert applied_rows(empty_dsn) == [(i + 1, name) for i, name in enumerate(names)]


def test_refuses_a_database_newer_than_the_code(empty_dsn: str) -> None:
    migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations (version, name) VALUES (999, '999_future')")
    with pytest.raises(SchemaTooNew, match="version 999"):
        migrate(empty_dsn)
    assert applied_rows(empty_dsn)[-1] == (999, "999_future")
    # The command says so and fails, rather than running against a schema it does not know.
    assert main(["migrate", "--dsn", empty_dsn]) == 2


def test_a_failing_migration_rolls_back_and_records_nothing(
    empty_dsn: str, tmp_path: Path
) -> None:
    n = next_number()
    folder = schema_with(tmp_path, {
        f"{n:03d}_good.sql": "CREATE TABLE good_marker (id int);",
        f"{n + 1:03d}_bad.sql": "CREATE TABLE half_done (id int); SELECT 1 / 0;",
    })
    with pytest.raises(psycopg.errors.DivisionByZero):
        migrate(empty_dsn, folder)
    assert [v for v, _ in applied_rows(empty_dsn)] == list(range(1, n + 1))
    assert table_exists(empty_dsn, "good_marker")
    assert not table_exists(empty_dsn, "half_done")
    # Fixed, it applies on the next run, alone; the advisory lock was released.
    (folder / f"{n + 1:03d}_bad.sql").write_text("CREATE TABLE half_done (id int);")
    assert migrate(empty_dsn, folder) == [f"{n + 1:03d}_bad"]
    assert table_exists(empty_dsn, "half_done")


def test_migration_files_must_be_numbered_without_gaps(tmp_path: Path) -> None:
    (tmp_path / "001_a.sql").write_text("SELECT 1;")
    (tmp_path / "003_c.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="without gaps"):
        load_migrations(tmp_path)
    (tmp_path / "2_b.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match=r"001_name\.sql"):
        load_migrations(tmp_path)


def test_migrate_command_reports_what_it_did(
    empty_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    last = load_migrations()[-1]
    assert main(["migrate", "--dsn", empty_dsn]) == 0
    out = capsys.readouterr().out
    assert f"applied {last.name} in " in out
    assert f"schema at version {last.version} ({last.name})" in out
    assert main(["--dsn", empty_dsn, "migrate"]) == 0
    assert "up to date, nothing applied" in capsys.readouterr().out

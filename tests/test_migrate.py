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


def schema_up_to(tmp_path: Path, version: int, files: dict[str, str] | None = None) -> Path:
    """A schema folder holding the real migrations up to `version`, plus `files`."""
    folder = tmp_path / f"schema_{version}"
    folder.mkdir()
    for m in load_migrations()[:version]:
        shutil.copy(SCHEMA_DIR / f"{m.name}.sql", folder / f"{m.name}.sql")
    for name, text in (files or {}).items():
        (folder / name).write_text(text)
    return folder


def index_state(dsn: str, name: str) -> tuple[bool, bool] | None:
    """(valid, ready) of an index, None if there is none."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT i.indisvalid, i.indisready FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s", (name,)).fetchone()
    return None if row is None else (bool(row[0]), bool(row[1]))


def test_a_no_transaction_migration_applies_and_runs_again_after_failing_midway(
    empty_dsn: str, tmp_path: Path
) -> None:
    migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE codes (code text)")
        conn.execute("INSERT INTO codes VALUES ('a'), ('b'), ('b')")
    n = next_number()
    # As schema/017: each index dropped first, so a build cut short is built again.
    folder = schema_with(tmp_path, {f"{n:03d}_codes_unique.sql": (
        "-- engine: no transaction\n"
        "-- Each statement in autocommit: CREATE INDEX CONCURRENTLY cannot run in a"
        " transaction.\n"
        "DROP INDEX CONCURRENTLY IF EXISTS codes_plain_idx;\n"
        "CREATE INDEX CONCURRENTLY codes_plain_idx ON codes (code);\n"
        "DROP INDEX CONCURRENTLY IF EXISTS codes_unique_idx;\n"
        "CREATE UNIQUE INDEX CONCURRENTLY codes_unique_idx ON codes (code);\n"
    )})
    # The duplicate 'b' fails the second build midway: the first index is built and stays,
    # the second is left behind invalid, and the file is not recorded.
    with pytest.raises(psycopg.errors.UniqueViolation):
        migrate(empty_dsn, folder)
    assert applied_rows(empty_dsn)[-1][0] == n - 1
    assert index_state(empty_dsn, "codes_plain_idx") == (True, True)
    left = index_state(empty_dsn, "codes_unique_idx")
    assert left is not None and not left[0]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM codes WHERE ctid = (SELECT max(ctid) FROM codes"
                     " WHERE code = 'b')")
    # Run again from the start: it applies, is recorded, and both indexes are valid.
    assert migrate(empty_dsn, folder) == [f"{n:03d}_codes_unique"]
    assert applied_rows(empty_dsn)[-1] == (n, f"{n:03d}_codes_unique")
    assert index_state(empty_dsn, "codes_plain_idx") == (True, True)
    assert index_state(empty_dsn, "codes_unique_idx") == (True, True)
    assert migrate(empty_dsn, folder) == []


def test_a_migration_whose_lock_timeout_fires_is_tried_again(
    empty_dsn: str, tmp_path: Path
) -> None:
    migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE busy (id int)")
    n = next_number()
    folder = schema_with(tmp_path, {f"{n:03d}_busy_column.sql": (
        "SET LOCAL lock_timeout = '100ms';\n"
        "ALTER TABLE busy ADD COLUMN note text;\n"
    )})
    gave_up: list[tuple[str, int]] = []
    with psycopg.connect(empty_dsn) as holder:
        # Another session's open transaction holds a lock on the table for a while.
        holder.execute("LOCK TABLE busy IN ACCESS SHARE MODE")
        release = threading.Timer(1.2, holder.rollback)
        release.start()
        try:
            applied = migrate(empty_dsn, folder, gave_up_waiting=lambda name, attempt:
                              gave_up.append((name, attempt)))
        finally:
            release.join()
    assert applied == [f"{n:03d}_busy_column"]
    assert gave_up and gave_up[0] == (f"{n:03d}_busy_column", 1)
    assert applied_rows(empty_dsn)[-1] == (n, f"{n:03d}_busy_column")
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT note FROM busy").fetchall() == []


def test_tenants_migration_puts_existing_rows_in_default(
    empty_dsn: str, tmp_path: Path
) -> None:
    """schema/016 and 017 on a database at 015 with rows of every kind: all of them read
    tenant 1, `default`; and the engine from before tenants, still running, can write."""
    migrate(empty_dsn, schema_up_to(tmp_path, 15))
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        dest = conn.execute("INSERT INTO destinations (url, secret) VALUES"
                            " ('http://127.0.0.1:9/a', 's') RETURNING id").fetchone()[0]
        conn.execute("INSERT INTO events (type, payload, delivery_count, idempotency_key)"
                     " SELECT 't', '{}', 1, 'key-' || g FROM generate_series(1, 40) g")
        conn.execute("INSERT INTO deliveries (event_id, destination_id)"
                     " SELECT id, %s FROM events WHERE id <= 20", [dest])
        conn.execute("UPDATE deliveries SET status = 'in_flight', locked_by = 'w',"
                     " locked_until = now() WHERE id <= 5")
        conn.execute(
            "INSERT INTO finished_deliveries (id, event_id, destination_id, status, attempt,"
            " next_attempt_at, created_at) SELECT nextval('delivery_id_seq'), id, %s,"
            " CASE WHEN id %% 2 = 0 THEN 'delivered' ELSE 'dead' END::delivery_status, 1,"
            " now(), now() FROM events WHERE id > 20", [dest])
    assert migrate(empty_dsn, schema_up_to(tmp_path, 17)) == ["016_tenants", "017_tenant_indexes"]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FILTER (WHERE tenant_id = 1) || '/' || count(*)"
            "          FROM destinations),"
            "       (SELECT count(*) FILTER (WHERE tenant_id = 1) || '/' || count(*) FROM events),"
            "       (SELECT count(*) FILTER (WHERE tenant_id = 1) || '/' || count(*)"
            "          FROM deliveries),"
            "       (SELECT count(*) FILTER (WHERE tenant_id = 1) || '/' || count(*)"
            "          FROM finished_deliveries)").fetchone()
        assert counts == ("1/1", "40/40", "20/20", "20/20")
        assert conn.execute("SELECT id, uid FROM tenants").fetchall() == [(1, "default")]
        # The engine from before tenants names no tenant_id (its enqueue and result
        # statements, a74506b): its rows take their destination's tenant ...
        other = conn.execute("INSERT INTO tenants (uid) VALUES ('b') RETURNING id").fetchone()[0]
        theirs = conn.execute("INSERT INTO destinations (url, secret, tenant_id) VALUES"
                              " ('http://127.0.0.1:9/b', 's', %s) RETURNING id",
                              [other]).fetchone()[0]
        conn.execute("INSERT INTO deliveries (event_id, destination_id) VALUES (1, %s), (2, %s)",
                     [dest, theirs])
        conn.execute("INSERT INTO finished_deliveries (id, event_id, destination_id, status,"
                     " attempt, next_attempt_at, created_at) VALUES"
                     " (nextval('delivery_id_seq'), 3, %s, 'delivered', 1, now(), now())",
                     [theirs])
        assert conn.execute(
            "SELECT destination_id, tenant_id FROM delivery_rows WHERE id > 40"
            " ORDER BY id").fetchall() == [(dest, 1), (theirs, other), (theirs, other)]
        # An Idempotency-Key is now one tenant's: another tenant may use the same key
        # (the old index, unique across tenants, is gone: docs/decisions/0028).
        assert conn.execute(
            "INSERT INTO events (type, payload, delivery_count, idempotency_key, tenant_id)"
            " VALUES ('t', '{}', 0, 'key-1', 1), ('t', '{}', 0, 'key-1', %s)"
            " ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL"
            " DO NOTHING RETURNING tenant_id", [other]).fetchall() == [(other,)]
    for index in ("finished_deliveries_tenant_idx", "events_tenant_created_idx",
                  "events_tenant_idempotency_idx"):
        assert index_state(empty_dsn, index) == (True, True), index
    assert index_state(empty_dsn, "events_idempotency_key_idx") is None

"""Apply the numbered SQL files in `schema/` in order, once each.

Many hosts may start at once, so the whole run holds a session advisory lock; each file
applies in its own transaction together with its row in `schema_migrations`.

A file whose first line is `-- engine: no transaction` (CREATE INDEX CONCURRENTLY, which a
transaction cannot hold) runs statement by statement in autocommit, then is recorded; it
must be safe to run again from the start (schema/017_tenant_indexes.sql).

A migration that gives up waiting for a lock (its own `lock_timeout`: it must not queue
the running engine's queries behind a long transaction) is tried again, a few times.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
import psycopg.errors

from engine.db import queries
from engine.db.sql_params import LockKeyParams, MigrationsRecordParams


def _schema_dir() -> Path:
    """schema/ of the source tree (a checkout, an editable install), else the copy a
    wheel installs under the environment's share/engine/schema (pyproject.toml's
    data-files): `pip install .` and the container image migrate as a checkout does."""
    source = Path(__file__).resolve().parents[2] / "schema"
    if source.is_dir():
        return source
    return Path(sys.prefix) / "share" / "engine" / "schema"


SCHEMA_DIR = _schema_dir()
# An arbitrary constant naming "engine migrations" in pg_advisory_lock's key space.
MIGRATION_LOCK_KEY = 0x656E67696E65  # "engine"
_FILE_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
# schema/current.sql is the generated picture of the result (engine/db/schema_dump.py), not a
# step: it is never applied.
_NOT_A_MIGRATION = "current.sql"
NO_TRANSACTION = "-- engine: no transaction"
# A migration whose lock_timeout fired is tried again after attempt x LOCK_PAUSE_S: its
# lock_timeout is short (it must give up before the deadlock detector picks a running
# engine's statement to cancel, schema/016_tenants.sql), so a busy moment costs a try.
LOCK_ATTEMPTS = 10
LOCK_PAUSE_S = 0.5
LOCK_RETRY_S = 0.05


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer engine than this one."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(schema_dir: Path = SCHEMA_DIR) -> list[Migration]:
    migrations = []
    for path in sorted(schema_dir.glob("*.sql")):
        if path.name == _NOT_A_MIGRATION:
            continue
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise ValueError(f"migration file name must look like 001_name.sql: {path.name}")
        migrations.append(Migration(int(match.group(1)), path.stem, path.read_text()))
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migrations must be numbered 1..N without gaps, found {versions}")
    return migrations


def migrate(
    dsn: str, schema_dir: Path = SCHEMA_DIR,
    progress: Callable[[str, float], None] | None = None,
    gave_up_waiting: Callable[[str, int], None] | None = None,
) -> list[str]:
    """Apply pending migrations; return the names applied (empty when up to date).
    `progress(name, seconds)` is called after each file is committed,
    `gave_up_waiting(name, attempt)` each time a file's lock_timeout fired."""
    migrations = load_migrations(schema_dir)
    applied_now: list[str] = []
    lock = LockKeyParams(lock_key=MIGRATION_LOCK_KEY)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not queries.MIGRATIONS_LOCK.run_sync(conn, lock).fetchone()[0]:  # type: ignore[index]
            time.sleep(LOCK_RETRY_S)
        try:
            queries.MIGRATIONS_TABLE.run_sync(conn)
            row = queries.MIGRATIONS_CURRENT.run_sync(conn).fetchone()
            current = row[0] if row else 0
            newest_known = migrations[-1].version if migrations else 0
            if current > newest_known:
                raise SchemaTooNew(
                    f"database schema is at version {current}, this engine knows only up to "
                    f"{newest_known}: upgrade the engine before running it against this database"
                )
            for migration in migrations:
                if migration.version <= current:
                    continue
                started = time.perf_counter()
                _apply(conn, migration, gave_up_waiting)
                applied_now.append(migration.name)
                if progress is not None:
                    progress(migration.name, time.perf_counter() - started)
        finally:
            queries.MIGRATIONS_UNLOCK.run_sync(conn, lock)
    return applied_now


def _apply(conn: psycopg.Connection, migration: Migration,
           gave_up_waiting: Callable[[str, int], None] | None) -> None:
    record = MigrationsRecordParams(version=migration.version, name=migration.name)
    for attempt in range(1, LOCK_ATTEMPTS + 1):
        try:
            if migration.sql.startswith(NO_TRANSACTION):
                for statement in _statements(migration.sql):
                    conn.execute(statement.encode())
                queries.MIGRATIONS_RECORD.run_sync(conn, record)
            else:
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    queries.MIGRATIONS_RECORD.run_sync(conn, record)
            return
        except psycopg.errors.LockNotAvailable:
            if gave_up_waiting is not None:
                gave_up_waiting(migration.name, attempt)
            if attempt == LOCK_ATTEMPTS:
                raise
            time.sleep(attempt * LOCK_PAUSE_S)


def _statements(sql: str) -> list[str]:
    """A no-transaction file's statements: split at each `;` that ends a line outside a
    dollar-quoted body (`DO $$ ... $$;`, whose statements end lines too: such a block is one
    statement, and may COMMIT between the batches it works through, schema/025)."""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    statements: list[str] = []
    current: list[str] = []
    quoted = False
    for line in lines:
        current.append(line)
        quoted ^= line.count("$$") % 2 == 1
        if not quoted and re.search(r";\s*$", line):
            statements.append(re.sub(r";\s*$", "", "\n".join(current)).strip())
            current = []
    statements.append("\n".join(current).strip())
    return [s for s in statements if s]


def schema_version(dsn: str) -> tuple[int, str | None]:
    """The newest migration applied to the database: (version, name), (0, None) if none."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = queries.MIGRATIONS_EXISTS.run_sync(conn).fetchone()
        if not exists or not exists[0]:
            return 0, None
        row = queries.MIGRATIONS_NEWEST.run_sync(conn).fetchone()
    return (int(row[0]), str(row[1])) if row else (0, None)

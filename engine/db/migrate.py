"""Apply the numbered SQL files in `schema/` in order, once each.

Many hosts may start at once, so the whole run holds a session advisory lock; each file
applies in its own transaction together with its row in `schema_migrations`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from engine.db import queries
from engine.db.sql_params import LockKeyParams, MigrationsRecordParams

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schema"
# An arbitrary constant naming "engine migrations" in pg_advisory_lock's key space.
MIGRATION_LOCK_KEY = 0x656E67696E65  # "engine"
_FILE_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
# schema/current.sql is the generated picture of the result (engine/db/schema_dump.py), not a
# step: it is never applied.
_NOT_A_MIGRATION = "current.sql"


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
) -> list[str]:
    """Apply pending migrations; return the names applied (empty when up to date).
    `progress(name, seconds)` is called after each file is committed."""
    migrations = load_migrations(schema_dir)
    applied_now: list[str] = []
    lock = LockKeyParams(lock_key=MIGRATION_LOCK_KEY)
    with psycopg.connect(dsn, autocommit=True) as conn:
        queries.MIGRATIONS_LOCK.run_sync(conn, lock)
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
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    record = MigrationsRecordParams(
                        version=migration.version, name=migration.name)
                    queries.MIGRATIONS_RECORD.run_sync(conn, record)
                applied_now.append(migration.name)
                if progress is not None:
                    progress(migration.name, time.perf_counter() - started)
        finally:
            queries.MIGRATIONS_UNLOCK.run_sync(conn, lock)
    return applied_now


def schema_version(dsn: str) -> tuple[int, str | None]:
    """The newest migration applied to the database: (version, name), (0, None) if none."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = queries.MIGRATIONS_EXISTS.run_sync(conn).fetchone()
        if not exists or not exists[0]:
            return 0, None
        row = queries.MIGRATIONS_NEWEST.run_sync(conn).fetchone()
    return (int(row[0]), str(row[1])) if row else (0, None)

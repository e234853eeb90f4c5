"""The PostgreSQL server the tests run against, and fresh databases on it.

`ENGINE_TEST_DSN` names a server (any database on it; we create our own) when set;
otherwise the session starts an embedded PostgreSQL 18 in a temporary folder, tuned for
speed rather than durability, and stops it at the end.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from engine.db import queries
from engine.db.migrate import migrate
from engine.db.sql_params import TableLeavesParams
from engine.testing.pgserver import throwaway_server

TABLES = ("delivery_attempts", "finished_deliveries", "deliveries", "events", "destinations",
          "delivery_minutes", "api_keys", "tenants", "portal_signing_keys", "event_types",
          "idempotency_keys", "payload_sweeps")


@contextmanager
def test_server() -> Iterator[str]:
    """Yield an admin DSN for a server the tests may create databases on."""
    given = os.environ.get("ENGINE_TEST_DSN")
    if given:
        yield given
        return
    with throwaway_server(durable=False, prefix="engine-test-pg-") as dsn:
        yield dsn


def with_database(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


class DatabaseFactory:
    """Makes databases cloned from one migrated template: a clean, migrated database per
    test in tens of milliseconds, without re-running migrations."""

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self.prefix = f"engine_test_{os.getpid()}"
        self.template = f"{self.prefix}_template"
        self._counter = itertools.count(1)
        self._made: list[str] = []
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {}")
            conn.execute(drop.format(sql.Identifier(self.template)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        migrate(with_database(admin_dsn, self.template))

    def create(self) -> str:
        name = f"{self.prefix}_{next(self._counter)}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(self.template)
                )
            )
        self._made.append(name)
        return with_database(self.admin_dsn, name)

    def drop(self, dsn: str) -> None:
        name = conninfo_to_dict(dsn)["dbname"]
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def drop_all(self) -> None:
        for name in [*self._made, self.template]:
            with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(name)
                    )
                )


def truncate_all(conn: psycopg.Connection) -> None:
    """Back to an empty, migrated state (used between hypothesis examples)."""
    conn.execute(
        "TRUNCATE " + ", ".join(TABLES) + " RESTART IDENTITY CASCADE"
    )
    conn.execute("ALTER SEQUENCE delivery_id_seq RESTART")
    conn.execute("INSERT INTO tenants (uid, name) VALUES ('default', 'default')")
    # Ingress processes reload their keys (engine/ingress/keys.py): ids start again.
    conn.execute("UPDATE auth_generation SET generation = generation + 1")
    # And their event-type catalogs (engine/ingress/catalog.py): the table is empty again.
    conn.execute("UPDATE event_type_generation SET generation = generation + 1")


def stop_autovacuum(conn: psycopg.Connection) -> None:
    """No autovacuum or autoanalyze on the queue's tables in this (per-test) database.

    For tests that replay a run and need the database to answer the same way each time
    (the hypothesis state machines): claims order ties in next_attempt_at by the heap
    order of the rows, and a vacuum that ran in one run but not in its replay moves rows
    (and an analyze changes plans), so the replay claims other rows, draws differently,
    and hypothesis reports FlakyStrategyDefinition (CI, 2026-12-01). With only the
    test's own connection on the database, pruning and plans then follow its
    statements alone."""
    for table in TABLES:
        for leaf in leaves(conn, table):
            conn.execute(f"ALTER TABLE {leaf} SET (autovacuum_enabled = false,"
                         " toast.autovacuum_enabled = false)")


def leaves(conn: psycopg.Connection, table: str) -> list[str]:
    """The tables holding `table`'s rows: itself, or a partitioned table's partitions
    (storage settings are theirs: PostgreSQL refuses them on a partitioned table)."""
    return [leaf for (leaf,) in queries.TABLE_LEAVES.run_sync(
        conn, TableLeavesParams(table_name=table)).fetchall()]

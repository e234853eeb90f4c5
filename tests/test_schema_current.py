"""schema/current.sql is the schema the migrations produce (engine/db/schema_dump.py)."""

from __future__ import annotations

import psycopg
import pytest

from engine.db.schema_dump import CURRENT_SQL, dump_schema

pytestmark = pytest.mark.pg_versions


def test_current_sql_matches_the_migrations(conn: psycopg.Connection) -> None:
    # `conn` is a freshly migrated database: whatever the migrations leave.
    assert dump_schema(conn) == CURRENT_SQL.read_text(), (
        "schema/current.sql is stale: regenerate it with `python -m engine.db.schema_dump`"
    )


def test_a_schema_change_shows_in_the_dump(conn: psycopg.Connection) -> None:
    """The comparison above can fail: an index or column the file lacks shows up."""
    before = dump_schema(conn)
    conn.execute("CREATE INDEX deliveries_extra_idx ON deliveries (created_at)")
    with_index = dump_schema(conn)
    assert "deliveries_extra_idx ON deliveries (created_at)" in with_index
    conn.execute("ALTER TABLE events ADD COLUMN note text")
    assert "    note text" in dump_schema(conn)
    assert with_index != before

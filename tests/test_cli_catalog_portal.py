"""`engine event-types …` and `engine portal …` against a real database: the catalog's
and the portal's routes from the command line, with JSON given inline or as @FILE; a bad
argument is one line, exit code 2, and nothing written."""

from __future__ import annotations

from pathlib import Path

import psycopg

from tests.test_cli_operator import Cli, cli, count

__all__ = ["cli"]  # the fixture, shared with test_cli_operator


def test_event_type_lifecycle(cli: Cli, conn: psycopg.Connection, tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "required": ["id"]}')
    made = cli.json("event-types", "create", "order.created", "--description", "placed",
                    "--schema", f"@{schema}", "--example", '{"id": 1}')
    assert (made["name"], made["schema"], made["example"]) == (
        "order.created", {"type": "object", "required": ["id"]}, {"id": 1})
    code, out, _ = cli.run("event-types", "list")
    assert code == 0 and "order.created" in out and "placed" in out
    code, out, _ = cli.run("event-types", "show", "order.created")
    assert code == 0 and '"required":["id"]' in out
    code, out, _ = cli.run("event-types", "delete", "order.created")
    assert code == 0 and "deleted" in out
    assert count(conn, "event_types") == 0


def test_event_type_bad_input_is_one_line_and_writes_nothing(
        cli: Cli, conn: psycopg.Connection) -> None:
    for argv, mentions in (
            (("--schema", "{not json"), "--schema: not valid JSON"),
            (("--schema", "@/nonexistent/schema.json"), "--schema: cannot read"),
            (("--schema", '{"type": 5}'), "schema"),
            (("--schema", '{"type": "object", "required": ["id"]}', "--example", "{}"),
             "required")):
        code, _, err = cli.run("event-types", "create", "order.created", *argv)
        assert code == 2 and mentions in err and err.count("\n") == 1, (argv, err)
    code, _, err = cli.run("event-types", "create", "bad name!")
    assert code == 2 and "name" in err
    assert count(conn, "event_types") == 0


def test_portal_link_and_rotation(cli: Cli, conn: psycopg.Connection) -> None:
    cli.json("tenants", "create", "acme")
    link = cli.json("portal", "link", "acme", "--expires-in", "600", "--read-only")
    assert link["url"].startswith("http://127.0.0.1:8080/portal/acme?token=ept_")
    assert (link["tenant"], link["read_only"]) == ("acme", True)
    code, _, err = cli.run("portal", "link", "acme", "--expires-in", str(8 * 86400))
    assert code == 2 and "expires" in err
    code, out, _ = cli.run("portal", "rotate-key")
    assert code == 0 and "every portal link made before" in out
    assert conn.execute("SELECT count(*) FILTER (WHERE retired_at IS NULL), count(*)"
                        " FROM portal_signing_keys").fetchone() == (1, 2)

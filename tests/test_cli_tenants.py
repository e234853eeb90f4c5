"""`engine tenants …`, `engine keys …` and `--tenant T` on the destination, send,
deliveries and replay commands, against a real database: objects made with --tenant T
are T's and invisible without it; a bad argument or an unknown tenant is one line, exit
code 2, and nothing written."""

from __future__ import annotations

import psycopg
import pytest

from tests.test_cli_operator import URL, Cli, cli, count, make_dead

__all__ = ["cli"]  # the fixture, shared with test_cli_operator


def tenant_id(conn: psycopg.Connection, uid: str) -> int:
    row = conn.execute("SELECT id FROM tenants WHERE uid = %s", [uid]).fetchone()
    assert row is not None
    return int(row[0])


def test_tenant_and_key_lifecycle(cli: Cli, conn: psycopg.Connection) -> None:
    made = cli.json("tenants", "create", "acme", "--name", "Acme Inc.")
    assert (made["uid"], made["name"], made["pending"], made["in_flight"]) == (
        "acme", "Acme Inc.", 0, 0)
    code, out, _ = cli.run("tenants", "create", "globex")
    assert code == 0 and "globex" in out

    listed = cli.json("tenants", "list")
    assert [t["uid"] for t in listed["data"]] == ["default", "acme", "globex"]
    assert listed["next"] is None
    first = cli.json("tenants", "list", "--limit", "2")
    assert [t["uid"] for t in first["data"]] == ["default", "acme"]
    rest = cli.json("tenants", "list", "--after", first["next"])
    assert [t["uid"] for t in rest["data"]] == ["globex"]
    code, out, _ = cli.run("tenants", "list", "--limit", "2")
    assert code == 0 and "Acme Inc." in out and f"--after {first['next']}" in out

    # T is the id or the uid.
    assert cli.json("tenants", "show", str(made["id"]))["uid"] == "acme"
    code, out, _ = cli.run("tenants", "show", "acme")
    assert code == 0 and "Acme Inc." in out and "pending" in out

    key = cli.json("keys", "create", "acme", "--name", "ci", "--scope", "send",
                   "--scope", "read")
    assert key["key"].startswith("ek_")
    assert (key["name"], key["scopes"], key["tenant"]) == ("ci", ["send", "read"], "acme")
    code, out, _ = cli.run("keys", "create", "acme")
    assert code == 0 and "ek_" in out and "cannot be shown again" in out
    # Stored as a hash: the key's text is nowhere in its row.
    rows = conn.execute("SELECT row_to_json(k)::text FROM api_keys k").fetchall()
    assert len(rows) == 2 and all(key["key"] not in row[0] for row in rows)

    keys = cli.json("keys", "list", "acme")["data"]
    assert [(k["name"], k["scopes"]) for k in keys] == [
        ("ci", ["send", "read"]), ("cli", ["send", "read", "manage"])]
    assert all("key" not in k for k in keys)
    code, out, _ = cli.run("keys", "list", "acme")
    assert code == 0 and "ci" in out and key["key"] not in out

    code, out, _ = cli.run("keys", "revoke", "acme", str(key["id"]))
    assert code == 0 and "revoked key" in out
    assert [k["name"] for k in cli.json("keys", "list", "acme")["data"]] == ["cli"]
    assert "not found" in cli.refused("keys", "revoke", "acme", str(key["id"]))
    code, out, _ = cli.run("keys", "list", "globex")
    assert code == 0 and "no keys" in out

    code, out, _ = cli.run("tenants", "delete", "acme")
    assert code == 0 and "deleted tenant acme" in out
    assert [t["uid"] for t in cli.json("tenants", "list")["data"]] == ["default", "globex"]
    assert "no tenant 'acme'" in cli.refused("tenants", "show", "acme")
    assert "cannot be deleted" in cli.refused("tenants", "delete", "default")


def test_tenant_flag_on_every_command(cli: Cli, conn: psycopg.Connection) -> None:
    cli.json("tenants", "create", "acme")
    cli.json("tenants", "create", "globex")
    acme = tenant_id(conn, "acme")

    made = cli.json("destinations", "create", URL, "--allow-private-targets",
                    "--tenant", "acme")
    ident = str(made["id"])
    assert made["tenant"] == "acme"
    row = conn.execute("SELECT tenant_id FROM destinations WHERE id = %s", [made["id"]])
    assert row.fetchone() == (acme,)
    # Invisible to the default tenant and to another one; the flag goes before or after
    # the action, and takes the id as well as the uid.
    assert cli.json("destinations", "list")["data"] == []
    assert cli.json("destinations", "list", "--tenant", "globex")["data"] == []
    assert [d["id"] for d in cli.json("destinations", "list", "--tenant", "acme")["data"]] \
        == [made["id"]]
    assert "not found" in cli.refused("destinations", "show", ident)
    assert "not found" in cli.refused("destinations", "pause", ident, "--tenant", "globex")
    assert cli.json("destinations", "--tenant", "acme", "show", ident)["url"] == URL
    assert cli.json("destinations", "show", ident, "--tenant", str(acme))["tenant"] == "acme"
    assert cli.json("destinations", "pause", ident, "--tenant", "acme")["paused"] is True
    assert cli.json("destinations", "resume", ident, "--tenant", "acme")["paused"] is False
    code, out, _ = cli.run("destinations", "show", ident, "--tenant", "acme")
    assert code == 0 and "acme" in out

    # send: the event is acme's and fans out to acme's destination only.
    assert cli.json("send", "--type", "t", "--payload", "1")["deliveries"] == 0
    sent = [cli.json("send", "--type", "t", "--payload", str(n), "--tenant", "acme")
            for n in range(3)]
    assert [s["deliveries"] for s in sent] == [1, 1, 1]
    row = conn.execute("SELECT tenant_id FROM events WHERE id = %s", [sent[0]["id"]])
    assert row.fetchone() == (acme,)
    assert "--destination" in cli.refused("send", "--type", "t", "--payload", "1",
                                          "--destination", ident)

    # deliveries: listed and shown within acme only.
    assert cli.json("deliveries")["data"] == []
    page = cli.json("deliveries", "--tenant", "acme")["data"]
    assert len(page) == 3 and {d["tenant"] for d in page} == {"acme"}
    delivery = str(page[0]["id"])
    assert "not found" in cli.refused("deliveries", "show", delivery)
    assert cli.json("deliveries", "show", delivery, "--tenant", "acme")["tenant"] == "acme"
    assert cli.json("deliveries", "--tenant", "acme", "show", delivery)["id"] == int(delivery)
    code, out, _ = cli.run("deliveries", "show", delivery, "--tenant", "acme")
    assert code == 0 and "acme" in out

    # replay: a delivery, then the destination's dead ones, within acme only.
    dead = make_dead(conn, 3)
    assert "not found" in cli.refused("replay", str(dead[0]))
    assert "not found" in cli.refused("replay", "--destination", ident)
    assert cli.json("replay", str(dead[0]), "--tenant", "acme")["status"] == "pending"
    assert cli.json("replay", "--destination", ident, "--tenant", "acme") == {"replayed": 2}
    assert count(conn, "finished_deliveries") == 0


@pytest.mark.parametrize(("argv", "says"), [
    (["tenants", "create", "has space"], "UID"),
    (["tenants", "create", "x" * 65], "UID"),
    (["tenants", "create", ""], "UID"),
    (["tenants", "create", "taken"], "exists already"),
    (["tenants", "show", "ghost"], "no tenant 'ghost'"),
    (["tenants", "show", "a/b"], "not a tenant id or uid"),
    (["tenants", "delete", "ghost"], "no tenant 'ghost'"),
    (["tenants", "delete", "default"], "cannot be deleted"),
    (["tenants", "list", "--limit", "0"], "--limit"),
    (["keys", "create", "ghost"], "no tenant 'ghost'"),
    (["keys", "create", "taken", "--scope", "admin"], "invalid choice"),
    (["keys", "create", "taken", "--name", ""], "--name"),
    (["keys", "list", "ghost"], "no tenant 'ghost'"),
    (["keys", "revoke", "ghost", "1"], "no tenant 'ghost'"),
    (["keys", "revoke", "taken", "77"], "key not found"),
    (["destinations", "create", URL, "--allow-private-targets", "--tenant", "ghost"],
     "no tenant 'ghost'"),
    (["destinations", "create", URL, "--allow-private-targets", "--tenant", "99"],
     "no tenant '99'"),
    (["destinations", "list", "--tenant", "ghost"], "no tenant 'ghost'"),
    (["destinations", "--tenant", "ghost", "show", "1"], "no tenant 'ghost'"),
    (["destinations", "list", "--tenant", "no way"], "not a tenant id or uid"),
    (["send", "--type", "t", "--payload", "1", "--tenant", "ghost"], "no tenant 'ghost'"),
    (["deliveries", "--tenant", "ghost"], "no tenant 'ghost'"),
    (["deliveries", "show", "1", "--tenant", "ghost"], "no tenant 'ghost'"),
    (["replay", "1", "--tenant", "ghost"], "no tenant 'ghost'"),
    (["replay", "--destination", "1", "--tenant", "ghost"], "no tenant 'ghost'"),
])
def test_bad_input_is_one_line_and_writes_nothing(
    cli: Cli, conn: psycopg.Connection, argv: list[str], says: str
) -> None:
    cli.json("tenants", "create", "taken")
    tenants = conn.execute("SELECT id, uid, deleted_at FROM tenants ORDER BY id").fetchall()
    assert says in cli.refused(*argv)
    assert conn.execute("SELECT id, uid, deleted_at FROM tenants ORDER BY id").fetchall() \
        == tenants
    for table in ("api_keys", "destinations", "events"):
        assert count(conn, table) == 0

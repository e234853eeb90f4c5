"""One clear line for the mistakes a person makes when starting or pointing the engine
(port in use, database unreachable or refusing the password, unreadable config, no
embedded PostgreSQL, a data folder of another user), instead of a traceback."""

from __future__ import annotations

import errno

import psycopg

from engine.db.database import describe


class CommandError(Exception):
    """A refusal to show as `engine: <message>` with exit code 2."""


def database_error(dsn: str | None, exc: psycopg.Error) -> CommandError:
    """What went wrong connecting to `dsn` (None: the embedded server), in one line, with
    what to do about it."""
    text = " ".join(str(exc).split())
    where = describe(dsn) if dsn else "(embedded)"
    lowered = text.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        hint = "the server refused the user or password: check the credentials in --dsn"
    elif "connection refused" in lowered:
        hint = "nothing accepts connections there: is PostgreSQL running, is the port right?"
    elif "does not exist" in lowered:
        hint = "create the database (createdb) or fix the name in --dsn"
    elif "timeout" in lowered or "timed out" in lowered:
        hint = "the server did not answer in time: check the host and the network"
    else:
        hint = "check --dsn, ENGINE_DSN or DATABASE_URL"
    # psycopg's text names the host and the failure; keep its last clause, not its prefix.
    reason = text.split(": ")[-1] if ": " in text else text
    return CommandError(f"cannot connect to the database {where}: {reason} ({hint})")


def check_bind(bind: str) -> None:
    """Refuse at once, in words, an address the supervisor could not listen on."""
    from engine.supervisor import open_listen_socket

    try:
        open_listen_socket(bind).close()
    except OSError as exc:
        raise listen_error(bind, exc) from None


def listen_error(bind: str, exc: OSError) -> CommandError:
    if exc.errno == errno.EADDRINUSE:
        return CommandError(
            f"cannot listen on {bind}: the address is already in use (another engine or"
            " program has it): stop it, or choose another with --bind HOST:PORT"
        )
    if exc.errno == errno.EACCES:
        return CommandError(
            f"cannot listen on {bind}: permission denied (ports below 1024 need privileges):"
            " choose another with --bind HOST:PORT"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return CommandError(
            f"cannot listen on {bind}: no such address on this machine: fix --bind HOST:PORT"
        )
    return CommandError(f"cannot listen on {bind}: {exc.strerror or exc}")

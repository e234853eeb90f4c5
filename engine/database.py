"""Which database the engine uses, and connections to it.

`--dsn`, else ENGINE_DSN, else DATABASE_URL (folded into Settings.dsn by config), else an
embedded PostgreSQL with its data under `./.engine/`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import conninfo_to_dict

from engine.config import Settings
from engine.embedded import EmbeddedServer, ensure_server


@dataclass
class Database:
    dsn: str
    embedded: EmbeddedServer | None = None

    def close(self) -> None:
        """Stop the embedded server if this process started it."""
        if self.embedded is not None:
            self.embedded.stop()


def open_database(settings: Settings, *, announce: bool = True) -> Database:
    if settings.dsn:
        return Database(settings.dsn)
    server = ensure_server(settings.data_dir / "pgdata")
    if announce:
        how = "started" if server.started_here else "reusing"
        print(
            f"engine: no --dsn, ENGINE_DSN or DATABASE_URL: {how} the embedded PostgreSQL "
            f"with data in {server.data_dir} ({server.dsn})",
            file=sys.stderr,
        )
    return Database(server.dsn, server)


def connect(dsn: str, **kwargs: object) -> psycopg.Connection:
    """An autocommit connection: the queue functions open their own short transactions."""
    return psycopg.connect(dsn, autocommit=True, **kwargs)  # type: ignore[arg-type]


def describe(dsn: str) -> str:
    """`user@host:port/dbname` for messages: never the password."""
    params = conninfo_to_dict(dsn)
    user = params.get("user") or "(default user)"
    host = params.get("host") or "(local socket)"
    port = f":{params['port']}" if params.get("port") else ""
    return f"{user}@{host}{port}/{params.get('dbname') or user}"

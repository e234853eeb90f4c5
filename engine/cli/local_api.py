"""The HTTP API's handlers, called in this process by the operator commands.

A command builds the request the API documents (a JSON body, query parameters, an
Idempotency-Key header), hands it to the same `IngressApp` that ingress serves, and reads
the answer: validation (msgspec types), the URL policy (engine.webhooks.targets), the SQL (store.py,
the group committer) and the error texts are the API's, with no second copy to drift.
No socket is opened; the request goes straight to the ASGI callable.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import msgspec
import psycopg

from engine.cli.errors import CommandError, database_error
from engine.config import Settings
from engine.db.database import open_database
from engine.db.migrate import load_migrations, migrate, schema_version
from engine.ingress.app import IngressApp

CONNECT_TIMEOUT_S = 10
_TENANTS_PREFIX = "/v1/tenants/"
# msgspec says where a value failed as "… - at `$.max_in_flight`"; a person typed a flag.
_AT_FIELD = re.compile(r"^(?P<message>.*) - at `\$\.(?P<field>[a-z_]+)(?P<rest>[^`]*)`$")
_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `(?P<field>[a-z_]+)`")
# The handlers' own checks say "timeout_ms: must be …".
_FIELD_PREFIX = re.compile(r"^(?P<field>[a-z_]+): (?P<message>.*)$")
# API names whose flag is not the name with dashes; `url` is the positional URL.
FLAG_NAMES = {"destination_id": "--destination", "destination_ids": "--destination",
              "url": "URL", "event_types": "--event-type", "type": "--type",
              "uid": "UID", "scopes": "--scope", "channels": "--channel"}


def _flag(field: str) -> str:
    return FLAG_NAMES.get(field) or "--" + field.replace("_", "-")


@dataclass
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        return msgspec.json.decode(self.body) if self.body else None


def flag_message(message: str) -> str:
    """An API validation message in the words of the command line."""
    match = _AT_FIELD.match(message)
    if match:
        return f"{_flag(match['field'])}{match['rest']}: {match['message']}"
    match = _UNKNOWN_FIELD.match(message)
    if match:
        return f"{_flag(match['field'])}: not supported by this engine's API"
    match = _FIELD_PREFIX.match(message)
    if match:
        return f"{_flag(match['field'])}: {match['message']}"
    return message


def _tenant_of_path(path: str) -> tuple[str | None, str]:
    """The tenant a /v1/tenants/T/… path names, and the path after it."""
    if not path.startswith(_TENANTS_PREFIX):
        return None, path
    tenant, _, rest = path.removeprefix(_TENANTS_PREFIX).partition("/")
    return tenant, rest


class LocalApi:
    """`call()` runs one API request against `dsn` on a private event loop."""

    def __init__(self, settings: Settings, dsn: str) -> None:
        self.settings = settings
        self.dsn = dsn

    def call(
        self, method: str, path: str, body: Any = None, *,
        query: dict[str, str] | None = None, headers: dict[str, str] | None = None,
    ) -> Answer:
        try:
            raw = body if isinstance(body, bytes) else (
                b"" if body is None else msgspec.json.encode(body)
            )
            for value in (headers or {}).values():
                value.encode("latin-1")
        except UnicodeEncodeError:
            # A terminal's bytes that are not UTF-8 arrive in sys.argv as lone surrogates.
            raise CommandError("an argument is not valid UTF-8 text") from None
        return asyncio.run(self._call(method, path, raw, query or {}, headers or {}))

    def check(
        self, method: str, path: str, body: Any = None, *,
        query: dict[str, str] | None = None, headers: dict[str, str] | None = None,
    ) -> Answer:
        """`call()`, raising CommandError with the API's message when it refuses."""
        answer = self.call(method, path, body, query=query, headers=headers)
        if answer.status < 300:
            return answer
        try:
            message = answer.json()["error"]["message"]
        except (msgspec.DecodeError, KeyError, TypeError):
            message = f"the API answered {answer.status}"
        if answer.status == 404:
            tenant, rest = _tenant_of_path(path)
            if tenant is not None and message == "tenant not found":
                raise CommandError(f"no tenant {tenant!r} (neither an id nor a uid): see"
                                   " `engine tenants list`")
            ident = next((part for part in rest.split("/") if part.isdigit()), "?")
            raise CommandError(f"{message} (id {ident})")
        raise CommandError(flag_message(message))

    async def _call(
        self, method: str, path: str, body: bytes, query: dict[str, str],
        headers: dict[str, str],
    ) -> Answer:
        app = IngressApp(self.settings, self.dsn)
        header_list = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in
                       headers.items()]
        header_list.append((b"content-length", str(len(body)).encode()))
        if self.settings.api_token:
            header_list.append((b"authorization", f"Bearer {self.settings.api_token}".encode()))
        scope = {
            "type": "http", "method": method, "path": path, "headers": header_list,
            "query_string": urlencode(query).encode(),
        }
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app.startup()
        try:
            await app(scope, receive, send)
        finally:
            await app.shutdown()
        status = next(m["status"] for m in sent if m["type"] == "http.response.start")
        return Answer(status, b"".join(m.get("body", b"") for m in sent
                                       if m["type"] == "http.response.body"))


def _check_schema(dsn: str, embedded: bool) -> None:
    newest = load_migrations()[-1].version
    version, _ = schema_version(dsn)
    if version == newest:
        return
    if embedded:
        # The local database this folder's engine made: bring it up to date as `engine`
        # itself would on start.
        migrate(dsn)
        return
    if version < newest:
        raise CommandError(
            f"the database schema is at version {version}, this engine needs {newest}:"
            " run `engine migrate` first (or start the engine, which migrates)"
        )
    raise CommandError(
        f"the database schema is at version {version}, newer than this engine knows"
        f" ({newest}): upgrade the engine"
    )


@contextmanager
def api_session(settings: Settings) -> Iterator[LocalApi]:
    """The API against the configured database (the embedded one by default), checked to
    be reachable and migrated first so that failures read as one line."""
    database = open_database(settings, announce=False)
    try:
        try:
            with psycopg.connect(database.dsn, connect_timeout=CONNECT_TIMEOUT_S):
                pass
            _check_schema(database.dsn, database.embedded is not None)
        except psycopg.OperationalError as exc:
            raise database_error(database.dsn, exc) from None
        yield LocalApi(settings, database.dsn)
    finally:
        database.close()

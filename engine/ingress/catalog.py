"""The event-type catalog as ingress checks events against it, from memory.

Each ingress process holds every catalog type with its schema compiled once (a
jsonschema_rs validator, kept while the schema's text is unchanged). A background loop
reads `event_type_generation` every REFRESH_S and reloads the catalog when it moved;
every change to the catalog moves it in the same statement (engine/sql/catalog/), and the
process that made the change reloads before it answers. So an event costs no database
round trip for its type, and a change reaches every process within REFRESH_S plus one
query (docs/decisions/0030).

Two libraries, each where it is best (docs/decisions/0030, measured):
- `jsonschema` (the reference implementation) checks a schema when it is stored: against
  the meta-schema its `$schema` names, Draft 2020-12 by default, regexes included.
- `jsonschema_rs` validates payloads: 5-6 µs for a 1 KB, 20-property payload where
  jsonschema's compiled validator takes 430 µs. It resolves no remote `$ref` (its
  retriever refuses), so a schema never makes ingress fetch anything.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass
from typing import Any

import jsonschema
import jsonschema_rs
import msgspec

from engine.db import queries
from engine.ingress import errors
from engine.ingress.schemas import EVENT_TYPE_NAME

log = logging.getLogger(__name__)

REFRESH_S = 0.25
MAX_SCHEMA_BYTES = 64 * 1024
_NAME = re.compile(EVENT_TYPE_NAME)
# An error message quotes the value that failed: kept to this many characters.
MAX_MESSAGE_CHARS = 300
# The drafts a schema may name in `$schema`; none named is Draft 2020-12.
DEFAULT_DRAFT = jsonschema.Draft202012Validator
_DRAFTS = {
    cls.META_SCHEMA["$schema"].rstrip("#"): cls
    for cls in (jsonschema.Draft4Validator, jsonschema.Draft6Validator,
                jsonschema.Draft7Validator, jsonschema.Draft201909Validator,
                jsonschema.Draft202012Validator)
}
_decode = msgspec.json.Decoder()


class SchemaProblem(ValueError):
    """A schema or an example the catalog refuses (the API's 422)."""


def _refuse_remote(uri: str) -> Any:
    raise SchemaProblem(f"$ref {uri!r}: remote documents are never fetched; use a local"
                        " reference (#/$defs/...)")


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "…"


def json_path(root: str, path: list[str | int] | Any) -> str:
    """`payload.customer.tier`, `payload.items[2]`: where in the document a rule failed."""
    text = root
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise SchemaProblem(f"name: must be 1 to 128 of A-Z a-z 0-9 . _ -, got {name!r}")


def compile_schema(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    """The validator payloads are checked with, after the schema was checked against its
    draft's meta-schema; SchemaProblem names what is wrong."""
    size = len(msgspec.json.encode(schema))
    if size > MAX_SCHEMA_BYTES:
        raise SchemaProblem(f"schema: {size} bytes as JSON, over {MAX_SCHEMA_BYTES}")
    declared = schema.get("$schema")
    if declared is None:
        draft = DEFAULT_DRAFT
    elif not isinstance(declared, str) or declared.rstrip("#") not in _DRAFTS:
        raise SchemaProblem(f"schema.$schema: {declared!r} is not a draft this engine knows"
                            f" ({', '.join(sorted(_DRAFTS))})")
    else:
        draft = _DRAFTS[declared.rstrip("#")]
    try:
        draft.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise SchemaProblem(_short(
            f"{json_path('schema', list(exc.absolute_path))}: not a valid JSON Schema"
            f" ({exc.validator}): {exc.message}")) from None
    try:
        return jsonschema_rs.validator_for(schema, retriever=_refuse_remote)
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        raise SchemaProblem(_short(f"schema: {str(exc).splitlines()[0]}")) from None


def first_failure(validator: jsonschema_rs.Validator, document: Any, root: str
                  ) -> str | None:
    """None when `document` passes; else where it fails, the rule and why, e.g.
    `payload.customer.tier: enum: "gold" is not one of "free" or "pro"`."""
    if validator.is_valid(document):
        return None
    error = next(iter(validator.iter_errors(document)))
    rule = error.schema_path[-1] if error.schema_path else "schema"
    return _short(f"{json_path(root, error.instance_path)}: {rule}: {error.message}")


@dataclass(frozen=True)
class CatalogType:
    schema_text: str | None
    validator: jsonschema_rs.Validator | None


class EventTypeCatalog:
    """Every catalog type of this engine, in memory. `admit` is the ingest check."""

    def __init__(self, connection: Callable[[], AbstractAsyncContextManager[Any]],
                 strict: bool) -> None:
        self._connection = connection
        self.strict = strict
        self._types: dict[str, CatalogType] = {}
        self._generation: int | None = None
        self._refresh_began = -1.0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    # The request side ---------------------------------------------------------------------

    async def admit(self, event_type: str, payload: bytes, where: str) -> None:
        """422 when the payload fails its type's schema, or, with --strict-event-types,
        when the type is not in the catalog. `where` prefixes the path in the message
        (`events[3].`). A type not known here may have been created a moment ago
        through another process: one refresh (shared by the misses waiting together)
        before a strict refusal."""
        if self._generation is None:
            await self.refresh(since=time.monotonic())
        known = self._types.get(event_type)
        if known is None and self.strict:
            await self.refresh(since=time.monotonic())
            known = self._types.get(event_type)
            if known is None:
                raise errors.invalid(
                    f"{where}type: {event_type!r} is not in the event-type catalog"
                    " (--strict-event-types)")
        if known is None or known.validator is None:
            return
        failure = first_failure(known.validator, _decode.decode(payload), f"{where}payload")
        if failure is not None:
            raise errors.invalid(f"{failure} (schema of event type {event_type!r})")

    # The background side ------------------------------------------------------------------

    def start(self) -> None:
        self._stopping = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="catalog")

    async def stop(self) -> None:
        """Ends the loop between two refreshes (as KeyRing.stop does, for the same
        reason: a cancel could land inside the pool's getconn)."""
        if self._task is not None:
            self._stopping.set()
            await self._task

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.refresh()
            except Exception:  # the gate logs outages; the catalog keeps its last types
                log.debug("catalog refresh failed", exc_info=True)
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), REFRESH_S)

    async def refresh(self, since: float | None = None) -> None:
        """Reload the catalog if event_type_generation moved since the last load. With
        `since` (a miss), a refresh that began after that moment is enough."""
        async with self._lock:
            if since is not None and self._refresh_began >= since:
                return
            self._refresh_began = time.monotonic()
            async with self._connection() as conn:
                row = await (await queries.EVENT_TYPE_GENERATION_READ.run(conn)).fetchone()
                generation = row[0] if row else 0
                if generation == self._generation:
                    return
                rows = await (await queries.EVENT_TYPES_LIVE.run(conn)).fetchall()
            self._types = {name: self._compiled(name, schema_text)
                           for name, schema_text, _ in rows}
            # The generation read with the rows: a change committed between the two
            # reads is then seen as a move at the next refresh.
            self._generation = rows[0][2] if rows else generation

    def _compiled(self, name: str, schema_text: str | None) -> CatalogType:
        """A type's validator, compiled again only when its schema changed."""
        held = self._types.get(name)
        if held is not None and held.schema_text == schema_text:
            return held
        if schema_text is None:
            return CatalogType(None, None)
        try:
            validator = jsonschema_rs.validator_for(_decode.decode(schema_text),
                                                    retriever=_refuse_remote)
        except (jsonschema_rs.ValidationError, ValueError):
            # Stored schemas were compiled once already (compile_schema): this would be a
            # library change between versions. The type is then checked by nothing.
            log.exception("event type %r: its schema no longer compiles", name)
            return CatalogType(schema_text, None)
        return CatalogType(schema_text, validator)

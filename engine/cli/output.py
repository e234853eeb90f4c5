"""How operator commands print: a table a person reads, or with --json the API's own JSON
(the same document `curl` would get, so scripts can move between the two)."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

_console: Console | None = None


def console() -> Console:
    global _console
    if _console is None:
        from rich.console import Console

        # No terminal (a pipe, a file): no colour codes, and tables as wide as they need.
        width = None if sys.stdout.isatty() else 200
        _console = Console(highlight=False, markup=False, width=width)
    return _console


def print_json(body: bytes) -> None:
    sys.stdout.write(body.decode() + "\n")
    sys.stdout.flush()


def when(value: str | None) -> str:
    """An RFC 3339 time from the API as local-free `YYYY-MM-DD HH:MM:SS` UTC."""
    if not value:
        return "-"
    parsed = dt.datetime.fromisoformat(value)
    return parsed.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.table import Table

    out = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for name in columns:
        out.add_column(name, overflow="fold")
    for row in rows:
        out.add_row(*(cell(v) for v in row))
    console().print(out)


def fields(pairs: Sequence[tuple[str, Any]]) -> None:
    """`name  value` lines for one object."""
    width = max(len(name) for name, _ in pairs)
    for name, value in pairs:
        console().print(f"{name.ljust(width)}  {cell(value)}", soft_wrap=True)


def line(text: str) -> None:
    console().print(text, soft_wrap=True)

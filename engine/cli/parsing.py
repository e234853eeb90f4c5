"""Argument parsing shared by the commands: a bad argument is one line and exit 2."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import NoReturn

import msgspec

from engine.cli.errors import CommandError
from engine.ingress.schemas import MAX_ID, TENANT_UID_PATTERN

_TENANT_UID = re.compile(TENANT_UID_PATTERN)


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage before its error; a person wants the error and where
    to look, on one line."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def positive_id(text: str) -> int:
    """An id as the API takes it in a path: an integer from 1 to 2**63-1."""
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_ID:
        raise argparse.ArgumentTypeError(f"not an id (an integer from 1 to {MAX_ID}): {text!r}")
    return int(text)


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print the API's JSON instead of a table")


def tenant_reference(text: str) -> str:
    """A tenant as the API takes it in a path: its id or its uid; refused here, not as a
    path the API does not know."""
    if not _TENANT_UID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"not a tenant id or uid (1-64 of A-Z a-z 0-9 . _ : -): {text!r}")
    return text


def add_tenant(parser: argparse.ArgumentParser, *, on_subcommand: bool = False) -> None:
    """--tenant T: the command acts on /v1/tenants/T/…; without it, the default tenant."""
    # On an action after its command, SUPPRESS keeps an unset flag from overwriting one
    # given before the action.
    parser.add_argument("--tenant", type=tenant_reference, metavar="T",
                        default=argparse.SUPPRESS if on_subcommand else None,
                        help="the tenant's id or uid (default: the default tenant)")


def tenant_path(args: argparse.Namespace, path: str) -> str:
    """`path` (/v1/…) under /v1/tenants/T/ when --tenant T was given."""
    tenant = getattr(args, "tenant", None)
    if tenant is None:
        return path
    return f"/v1/tenants/{tenant}/" + path.removeprefix("/v1/")


def json_argument(flag: str, text: str) -> msgspec.Raw:
    """A JSON flag's value (--payload, --filter): JSON text, or @FILE; checked to be one
    JSON value so the error can name the flag (the API would point into the request body
    it was placed in). Passed to the API as the exact text given."""
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"{flag}: cannot read {path}: {exc.strerror}") from None
    else:
        # Bytes of the terminal that are not UTF-8 reach sys.argv as lone surrogates.
        raw = text.encode(errors="surrogateescape")
    try:
        msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise CommandError(f"{flag}: not valid JSON: {exc}") from None
    return msgspec.Raw(raw.strip())

"""Argument parsing shared by the commands: a bad argument is one line and exit 2."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from engine.ingress.schemas import MAX_ID


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

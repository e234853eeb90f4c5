"""Routing by content (SPEC "Routing"): a destination's payload filter, validated and
compiled once when it is written, and the channel names of events and destinations.

A filter is a JSON object. Each key is a dotted path into the payload (a numeric segment
indexes an array and never names an object's member) whose value is an object of
operators, or one of `$and`, `$or` (non-empty lists of filters) and `$not` (one filter).
Every key of a filter, and every operator of a path, must hold. What each operator means,
two-valued (true or false, never "unknown"):

- `$eq v`: the path exists and holds a value of v's JSON type equal to v (numbers by
  value, so 1 equals 1.0; 1 never equals "1", and true is not 1). `$neq v` is its negation.
- `$in [v…]`: `$eq` one of them; `$nin` is its negation. So `$neq` and `$nin` hold when the
  path is missing.
- `$gt $gte $lt $lte v` (v a number or a string): the value has v's type and compares so
  (numbers by value, strings by Unicode code point). Values of different types never
  compare true: `{"$gt": 1}` is false for "2", for true and for a missing path.
- `$exists true|false`: the path is (not) there; a null value is there.

The compiled form is a PostgreSQL jsonpath predicate in strict mode (no implicit array
unwrapping), stored beside the filter and run by enqueue_events.sql inside the ingest
transaction (docs/decisions/0033-routing-filters.md). jsonpath's comparisons are
three-valued (a missing path or a type mismatch is "unknown"); a negation is therefore
compiled as `(x) is unknown || !(x)`, and the statement reads a final unknown as false.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

import msgspec

# SPEC: nesting deeper than 10 and filters over 4 KiB are refused at creation.
MAX_FILTER_DEPTH = 10
MAX_FILTER_BYTES = 4096
# An array index is at most 9 digits: jsonpath's subscripts are 32-bit integers.
_INDEX = re.compile(r"[0-9]{1,9}")
_DIGITS = re.compile(r"[0-9]+")
COMBINATORS = ("$and", "$or", "$not")
SCALAR_OPERATORS = ("$eq", "$neq")
ORDER_OPERATORS = ("$gt", "$gte", "$lt", "$lte")
LIST_OPERATORS = ("$in", "$nin")
OPERATORS = (*SCALAR_OPERATORS, *ORDER_OPERATORS, *LIST_OPERATORS, "$exists")
_JSONPATH_COMPARISON = {"$eq": "==", "$neq": "==", "$gt": ">", "$gte": ">=", "$lt": "<",
                        "$lte": "<="}

# Payloads PostgreSQL's jsonb cannot hold, though they are valid JSON: a \u0000 escape,
# or a number beyond numeric's range (more than 131,072 digits before the point or 16,383
# after it). Such a payload matches no filter (enqueue_events.sql does not parse it);
# destinations without a filter still receive it. Events are written as filterable; only
# when PostgreSQL refuses to parse one does the committer check each payload of the batch
# with payload_is_filterable and write again (committer.py), so the accept path pays
# nothing for the rare payload.
_EXACT = msgspec.json.Decoder(float_hook=Decimal)
MAX_NUMERIC_SCALE = 16_383
MAX_NUMERIC_INTEGER_DIGITS = 131_072
# Integers of at most this many bits have at most MAX_NUMERIC_INTEGER_DIGITS digits.
MAX_NUMERIC_INTEGER_BITS = int(MAX_NUMERIC_INTEGER_DIGITS * math.log2(10))


class FilterError(ValueError):
    """A filter the API refuses (422); the message names the problem and where."""


def payload_is_filterable(payload: str) -> bool:
    """Whether enqueue_events.sql may parse this (valid JSON) payload as jsonb (exact, at
    the cost of decoding it)."""
    try:
        return _jsonb_can_hold(_EXACT.decode(payload))
    except (msgspec.DecodeError, ValueError):
        return False


def _jsonb_can_hold(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return value.bit_length() <= MAX_NUMERIC_INTEGER_BITS
    if isinstance(value, Decimal):
        _, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)  # finite: JSON has no NaN or infinity
        return (-exponent <= MAX_NUMERIC_SCALE
                and len(digits) + exponent <= MAX_NUMERIC_INTEGER_DIGITS)
    if isinstance(value, list):
        return all(_jsonb_can_hold(item) for item in value)
    return all("\x00" not in key and _jsonb_can_hold(item) for key, item in value.items())


def compile_filter(document: dict[str, Any] | None) -> tuple[str, str] | None:
    """A filter from a request, validated: (its JSON text as stored, its jsonpath), or None
    when there is none (null, or `{}`: no conditions). Raises FilterError."""
    if document is None or document == {}:
        return None
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode())
    if size > MAX_FILTER_BYTES:
        raise FilterError(f"filter: {size} bytes, over the limit of {MAX_FILTER_BYTES}")
    return text, "strict " + _filter(document, "filter", 1)


def _filter(document: Any, where: str, depth: int) -> str:
    if depth > MAX_FILTER_DEPTH:
        raise FilterError(f"{where}: nested deeper than {MAX_FILTER_DEPTH} filters")
    if not isinstance(document, dict) or not document:
        raise FilterError(f"{where}: must be a non-empty object")
    parts: list[str] = []
    for key, value in document.items():
        inner = f"{where}.{key}"
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise FilterError(f"{inner}: must be a non-empty list of filters")
            joined = (" && " if key == "$and" else " || ").join(
                _filter(item, f"{inner}[{n}]", depth + 1) for n, item in enumerate(value))
            parts.append(f"({joined})")
        elif key == "$not":
            parts.append(_negation(_filter(value, inner, depth + 1)))
        elif key.startswith("$"):
            raise FilterError(f"{inner}: unknown operator {key!r} (operators: $and, $or,"
                              " $not, or a path whose value holds "
                              + ", ".join(OPERATORS) + ")")
        else:
            parts.append(_conditions(_path(key, where), value, inner))
    return parts[0] if len(parts) == 1 else "(" + " && ".join(parts) + ")"


def _negation(predicate: str) -> str:
    """Two-valued NOT: jsonpath's `!` keeps "unknown" (a missing path), which must read
    as false before it is negated."""
    return f"(({predicate}) is unknown || !({predicate}))"


def _path(key: str, where: str) -> str:
    """A dotted path as a jsonpath accessor chain from the root."""
    if "\x00" in key:
        raise FilterError(f"{where}: bad path {key!r}: NUL character")
    accessors = ["$"]
    for segment in key.split("."):
        if segment == "":
            raise FilterError(f"{where}: bad path {key!r}: an empty segment")
        if _DIGITS.fullmatch(segment):
            if not _INDEX.fullmatch(segment):
                raise FilterError(f"{where}: bad path {key!r}: array index {segment} is"
                                  " over 9 digits")
            accessors.append(f"[{int(segment)}]")
        else:
            accessors.append("." + _string(segment))
    return "".join(accessors)


def _conditions(path: str, operators: Any, where: str) -> str:
    if not isinstance(operators, dict) or not operators:
        raise FilterError(f"{where}: must be an object of operators ("
                          + ", ".join(OPERATORS) + ")")
    parts = [_condition(path, op, value, f"{where}.{op}") for op, value in operators.items()]
    return parts[0] if len(parts) == 1 else "(" + " && ".join(parts) + ")"


def _condition(path: str, operator: str, value: Any, where: str) -> str:
    if operator in SCALAR_OPERATORS:
        equal = f"{path} == {_scalar(value, where)}"
        return equal if operator == "$eq" else _negation(equal)
    if operator in ORDER_OPERATORS:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise FilterError(f"{where}: must be a number or a string")
        return f"{path} {_JSONPATH_COMPARISON[operator]} {_scalar(value, where)}"
    if operator in LIST_OPERATORS:
        if not isinstance(value, list) or not value:
            raise FilterError(f"{where}: must be a non-empty list of values")
        any_equal = "(" + " || ".join(
            f"{path} == {_scalar(item, f'{where}[{n}]')}" for n, item in enumerate(value)
        ) + ")"
        return any_equal if operator == "$in" else _negation(any_equal)
    if operator == "$exists":
        if not isinstance(value, bool):
            raise FilterError(f"{where}: must be true or false")
        exists = f"exists({path})"
        return exists if value else _negation(exists)
    raise FilterError(f"{where}: unknown operator {operator!r} (operators: "
                      + ", ".join(OPERATORS) + ")")


def _scalar(value: Any, where: str) -> str:
    """A JSON scalar as a jsonpath literal. Objects and arrays are refused: jsonpath
    compares scalars only."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # repr: the shortest text that reads back as this float; jsonpath reads it exactly.
        return repr(value)
    if isinstance(value, str):
        if "\x00" in value:
            raise FilterError(f"{where}: NUL character")
        return _string(value)
    raise FilterError(f"{where}: must be a string, a number, true, false or null")


def _string(text: str) -> str:
    """A jsonpath string literal (its escapes are JSON's)."""
    return json.dumps(text, ensure_ascii=False)


def channel_list(channels: list[str] | None) -> list[str] | None:
    """Channel names as stored: duplicates dropped (first kept), and none as NULL (an
    event without channels reaches destinations whatever theirs)."""
    if not channels:
        return None
    return list(dict.fromkeys(channels))

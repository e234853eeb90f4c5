"""Every engine/sql/ statement's header lists its parameters, every statement with two or
more is bound through a typed tuple (engine/sql_params.py) built by keyword, and the
header's names are the tuple's fields in order: a parameter reordered on one side fails
here instead of writing the wrong column."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from engine import queries, sql_params
from engine.sql_params import STATEMENT_PARAMETERS

SQL_DIR = Path(queries.__file__).with_name("sql")
SQL_TYPE = r"(?:text|int|bigint|bool|float8|timestamptz|json|jsonb|bytea)(?:\[\])?"
# "$5 capped destination ids bigint[]": the number, the name, the type.
DEFINITION = re.compile(rf"\$(\d+)\s+([A-Za-z][\w\- ]*?)\s+{SQL_TYPE}(?=[\s,:;(]|$)")
PARAMETER = re.compile(r"\$(\d+)")


def split(path: Path) -> tuple[str, str]:
    """(header, body): the leading comment lines, and the statement without comments."""
    lines = path.read_text().splitlines()
    count = 0
    while count < len(lines) and lines[count].startswith("--"):
        count += 1
    body = "\n".join(line.split("--", 1)[0] for line in lines[count:])
    return "\n".join(lines[:count]), body


def header_names(header: str) -> list[str]:
    """The parameter names in $n order, as `snake_case`; each $n's first definition."""
    names: dict[int, str] = {}
    for number, name in DEFINITION.findall(header):
        names.setdefault(int(number), re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_"))
    assert sorted(names) == list(range(1, len(names) + 1)), f"gaps in {sorted(names)}"
    return [names[n] for n in sorted(names)]


@pytest.mark.parametrize("path", sorted(SQL_DIR.glob("*.sql")), ids=lambda p: p.stem)
def test_every_parameter_a_statement_binds_is_in_its_header(path: Path) -> None:
    header, body = split(path)
    assert header, f"{path.name} has no header comment"
    used = {int(n) for n in PARAMETER.findall(body)}
    listed = {int(n) for n in PARAMETER.findall(header)}
    assert used <= listed, f"{path.name}: ${sorted(used - listed)} not in the header"
    assert used == set(range(1, len(used) + 1)), f"{path.name}: gaps in {sorted(used)}"


@pytest.mark.parametrize("name", sorted(STATEMENT_PARAMETERS))
def test_each_header_names_the_parameters_in_the_order_their_tuple_binds_them(
    name: str,
) -> None:
    header, body = split(SQL_DIR / f"{name}.sql")
    fields = list(STATEMENT_PARAMETERS[name]._fields)  # type: ignore[attr-defined]
    assert header_names(header) == fields
    assert max(int(n) for n in PARAMETER.findall(body)) == len(fields)
    # The statement the tuple binds is the one engine.queries loads under that name.
    assert getattr(queries, name.upper()) == (SQL_DIR / f"{name}.sql").read_bytes()


@pytest.mark.parametrize("path", sorted(SQL_DIR.glob("*.sql")), ids=lambda p: p.stem)
def test_every_statement_with_two_or_more_parameters_has_a_tuple(path: Path) -> None:
    # One parameter cannot be bound in the wrong order; two or more can, so a new
    # statement's tuple must not be forgotten.
    _, body = split(path)
    if len(set(PARAMETER.findall(body))) >= 2:
        assert path.stem in STATEMENT_PARAMETERS, f"{path.name} has no tuple in sql_params.py"


TUPLES = {tuple_.__name__ for tuple_ in STATEMENT_PARAMETERS.values()}
ENGINE_DIR = Path(sql_params.__file__).parent


@pytest.mark.parametrize(
    "path", sorted(ENGINE_DIR.rglob("*.py")), ids=lambda p: str(p.relative_to(ENGINE_DIR))
)
def test_the_engine_binds_statements_through_their_tuples_built_by_keyword(path: Path) -> None:
    # By keyword, a field moved in its tuple still gets its own value: the header test
    # above then catches the statement that no longer matches. A literal tuple or list
    # passed right after `queries.NAME` bypasses the tuple (a statement chosen through a
    # variable is not seen here; its tuple is still built by keyword).
    wrong: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id in TUPLES and node.args:
            wrong.append(f"{path.name}:{node.lineno} builds {node.func.id} by position")
        for statement, params in zip(node.args, node.args[1:], strict=False):
            if (isinstance(statement, ast.Attribute) and isinstance(statement.value, ast.Name)
                    and statement.value.id == "queries"
                    and statement.attr.lower() in STATEMENT_PARAMETERS
                    and isinstance(params, ast.Tuple | ast.List)):
                wrong.append(f"{path.name}:{node.lineno} binds {statement.attr} without its tuple")
    assert not wrong

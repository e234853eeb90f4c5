"""Every engine/sql/ statement is declared once in engine/db/queries.py with the type its
parameters are bound through (engine/db/sql_params.py), its header lists those parameters,
and the header's names are the type's fields in order: a parameter reordered on one side
fails here instead of writing the wrong column. Types are built by keyword."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from engine.db import queries, sql_params
from engine.db.queries import STATEMENTS, Statement

SQL_DIR = queries.SQL_DIR
SQL_FILES = sorted(SQL_DIR.rglob("*.sql"))
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


def test_every_file_is_one_declared_statement_and_every_statement_one_file() -> None:
    stems = [path.stem for path in SQL_FILES]
    assert len(stems) == len(set(stems)), "two files under engine/sql/ share a name"
    assert sorted(stems) == sorted(STATEMENTS), "a file without a Statement, or the reverse"
    for name, statement in STATEMENTS.items():
        assert getattr(queries, name.upper()) is statement
        assert statement.sql == next(SQL_DIR.rglob(f"{name}.sql")).read_bytes()


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: p.stem)
def test_every_parameter_a_statement_binds_is_in_its_header(path: Path) -> None:
    header, body = split(path)
    assert header, f"{path.name} has no header comment"
    used = {int(n) for n in PARAMETER.findall(body)}
    listed = {int(n) for n in PARAMETER.findall(header)}
    assert used <= listed, f"{path.name}: ${sorted(used - listed)} not in the header"
    assert used == set(range(1, len(used) + 1)), f"{path.name}: gaps in {sorted(used)}"


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_each_header_names_the_parameters_in_the_order_their_type_binds_them(
    name: str,
) -> None:
    statement = STATEMENTS[name]
    header, body = split(next(SQL_DIR.rglob(f"{name}.sql")))
    used = {int(n) for n in PARAMETER.findall(body)}
    if statement.params is None:
        assert not used, f"{name} binds parameters but declares no type for them"
        return
    fields = list(statement.params._fields)  # type: ignore[attr-defined]
    assert header_names(header) == fields
    assert max(used) == len(fields)


def test_a_statement_refuses_parameters_not_of_its_type() -> None:
    # A bare tuple (or another statement's type) would bind by position unchecked.
    claim = Statement.__new__(Statement)
    claim.name, claim.params, claim.sql = "x", sql_params.TenantDeliveryParams, b""
    assert claim._bound(sql_params.TenantDeliveryParams(delivery_id=1, tenant_id=2)) == (1, 2)
    with pytest.raises(TypeError):
        claim._bound((1,))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        claim._bound(sql_params.TenantEventParams(event_id=1, tenant_id=2))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        queries.DATABASE_NOW._bound((1,))  # type: ignore[arg-type]


TYPES = {statement.params.__name__ for statement in STATEMENTS.values() if statement.params}
ENGINE_DIR = Path(sql_params.__file__).parents[1]


@pytest.mark.parametrize(
    "path", sorted(ENGINE_DIR.rglob("*.py")), ids=lambda p: str(p.relative_to(ENGINE_DIR))
)
def test_the_engine_builds_parameter_types_by_keyword(path: Path) -> None:
    # By keyword, a field moved in its type still gets its own value: the header test
    # above then catches the statement that no longer matches.
    wrong = [
        f"{path.name}:{node.lineno} builds {node.func.id} by position"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id in TYPES and node.args
    ]
    assert not wrong


# Every statement the engine runs is a file (engine/db/queries.py runs them). The rule, over
# every engine/**/*.py but engine/db/queries.py: no string literal (str, bytes, or an
# f-string's leading text) starts with an SQL command in capitals followed by a space or
# a line break ("SELECT ...", "NOTIFY ...", b"SET ..."; "DELETE" alone is an HTTP method).
# Two kinds are allowed:
# - the literal of psycopg's sql.SQL(...): a statement whose identifiers vary (a database,
#   table, setting or channel name), which a file's $n placeholders cannot bind;
# - f-strings in the functions below, which write SQL out as text for a person or a file
#   (schema/current.sql, the autovacuum advice) instead of running it.
SQL_COMMAND = re.compile(
    r"\s*(?:SELECT|INSERT|UPDATE|DELETE|WITH|VALUES|TABLE|NOTIFY|LISTEN|UNLISTEN|SET|RESET"
    r"|SHOW|BEGIN|START|COMMIT|ROLLBACK|SAVEPOINT|CREATE|DROP|ALTER|TRUNCATE|VACUUM"
    r"|ANALYZE|EXPLAIN|COPY|LOCK|DO|CALL|PREPARE|EXECUTE|DEALLOCATE|DECLARE|FETCH|GRANT"
    r"|REVOKE|DISCARD|REFRESH|CLUSTER|REINDEX|COMMENT)[ \n]")
WRITTEN_NOT_RUN = {
    ("schema_dump.py", "dump_schema"), ("schema_dump.py", "_table"),
    ("autovacuum_advice.py", "statement"),
}


def sql_literals(source: str, file_name: str) -> list[str]:
    """The string literals of `source` (the module `file_name`) that read as an SQL
    statement, as `line: text`."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def allowed(node: ast.AST) -> bool:
        parent = parents.get(node)
        if isinstance(parent, ast.Call) and node in parent.args and (
                getattr(parent.func, "attr", None) == "SQL"
                or getattr(parent.func, "id", None) == "SQL"):
            return True
        while parent is not None and not isinstance(parent, ast.FunctionDef):
            parent = parents.get(parent)
        return (isinstance(node, ast.JoinedStr) and parent is not None
                and (file_name, parent.name) in WRITTEN_NOT_RUN)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and not isinstance(parents.get(node), ast.JoinedStr):
            value = node.value
            text = value.decode("latin-1") if isinstance(value, bytes) else value
        elif isinstance(node, ast.JoinedStr) and isinstance(node.values[0], ast.Constant):
            text = node.values[0].value
        else:
            continue
        if isinstance(text, str) and SQL_COMMAND.match(text) and not allowed(node):
            found.append(f"{node.lineno}: {text[:40]!r}")
    return found


@pytest.mark.parametrize(
    "path", sorted(p for p in ENGINE_DIR.rglob("*.py") if p != Path(queries.__file__)),
    ids=lambda p: str(p.relative_to(ENGINE_DIR)),
)
def test_every_statement_the_engine_runs_is_a_file(path: Path) -> None:
    assert not sql_literals(path.read_text(), path.name), "SQL in Python: make it a file"


def test_the_file_rule_sees_sql_in_python() -> None:
    source = """
A = "SELECT 1"
B = b"NOTIFY x"
C = f"SET x = {y}"
D = "DELETE"
E = sql.SQL("LISTEN {}")
F = "Select the rows"
def _table(name):
    return f"CREATE TABLE {name} ();"
"""
    assert [found.split(":")[0] for found in sql_literals(source, "other.py")] == [
        "2", "3", "4", "9"]
    assert [found.split(":")[0] for found in sql_literals(source, "schema_dump.py")] == [
        "2", "3", "4"]

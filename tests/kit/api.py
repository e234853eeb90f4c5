"""Helpers of the tests that drive the ingress API over HTTP (its fixtures, `server`, `api`
and `db`, are in tests/conftest.py)."""

from __future__ import annotations

import psycopg

from engine.testing.ingress_server import Answer, IngressProcess


def count(db: psycopg.Connection, table: str) -> int:
    row = db.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def make_destination(api: IngressProcess, **fields: object) -> dict:
    fields.setdefault("url", "http://127.0.0.1:9/hook")
    answer = api.request("POST", "/v1/destinations", fields)
    assert answer.status == 201, answer
    return answer.json()


def assert_error(answer: Answer, status: int, mentions: str = "") -> None:
    assert answer.status == status, answer
    error = answer.json()["error"]
    assert set(error) == {"code", "message"}
    assert mentions in error["message"]

"""Tenants and their API keys over real HTTP (SPEC, "Tenants and API keys"): the tenant
routes, keys shown once and stored as a hash, scopes, fan-out within a tenant, the
unscoped paths meaning the key's tenant, revocation on every ingress process within a
second, and each bad input a clear 4xx that writes nothing. The cross-tenant sweep over
every route is tests/test_tenant_isolation.py."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

import psycopg
import pytest

from engine.testing.ingress_server import Answer, IngressProcess
from tests.kit.api import assert_error, count

TOKEN = "admin-token-for-tenant-tests"


@pytest.fixture(scope="module")
def ingress_token() -> str:
    return TOKEN


def as_key(api: IngressProcess, key: str, method: str, path: str, body: object = None,
           **extra: object) -> Answer:
    return api.request(method, path, body, auth=False,
                       headers={"Authorization": f"Bearer {key}"}, **extra)  # type: ignore[arg-type]


def make_tenant(api: IngressProcess, uid: str, **fields: object) -> dict:
    answer = api.request("POST", "/v1/tenants", {"uid": uid, **fields})
    assert answer.status == 201, answer
    return answer.json()


def make_key(api: IngressProcess, tenant: str, **fields: object) -> str:
    answer = api.request("POST", f"/v1/tenants/{tenant}/keys", {"name": "k", **fields})
    assert answer.status == 201, answer
    return answer.json()["key"]


def test_tenant_lifecycle_by_uid_and_id(api: IngressProcess, db: psycopg.Connection) -> None:
    made = make_tenant(api, "acme:eu-1", name="Acme", metadata={"plan": "gold"})
    assert (made["uid"], made["name"]) == ("acme:eu-1", "Acme")
    assert made["metadata"] == {"plan": "gold"}
    by_id = api.request("GET", f"/v1/tenants/{made['id']}").json()
    assert by_id == api.request("GET", "/v1/tenants/acme:eu-1").json()
    patched = api.request("PATCH", "/v1/tenants/acme:eu-1",
                          {"name": None, "max_in_flight": 5, "rate_limit": 20}).json()
    assert (patched["name"], patched["max_in_flight"], patched["rate_limit"]) == (None, 5, 20)
    listed = api.request("GET", "/v1/tenants").json()["data"]
    assert [t["uid"] for t in listed] == ["default", "acme:eu-1"]
    assert api.request("DELETE", "/v1/tenants/acme:eu-1").status == 204
    assert_error(api.request("GET", "/v1/tenants/acme:eu-1"), 404, "tenant")
    # The uid is free again.
    assert make_tenant(api, "acme:eu-1")["id"] != made["id"]


def test_tenant_list_pages_and_shows_backlogs(api: IngressProcess) -> None:
    for n in range(5):
        make_tenant(api, f"t{n}")
    api.request("POST", "/v1/tenants/t3/destinations", {"url": "http://127.0.0.1:9/"})
    api.request("POST", "/v1/tenants/t3/events", {"type": "a", "payload": {}})
    first = api.request("GET", "/v1/tenants?limit=4").json()
    second = api.request("GET", f"/v1/tenants?limit=4&after={first['next']}").json()
    uids = [t["uid"] for t in first["data"] + second["data"]]
    assert uids == ["default", "t0", "t1", "t2", "t3", "t4"] and second["next"] is None
    backlog = {t["uid"]: t["pending"] + t["in_flight"] for t in first["data"] + second["data"]}
    assert backlog == {"default": 0, "t0": 0, "t1": 0, "t2": 0, "t3": 1, "t4": 0}


def test_key_is_shown_once_and_stored_as_a_hash(api: IngressProcess, db: psycopg.Connection
                                                ) -> None:
    make_tenant(api, "a")
    created = api.request("POST", "/v1/tenants/a/keys", {"name": "ci", "scopes": ["read"]})
    assert created.status == 201, created
    body = created.json()
    key = body["key"]
    assert key.startswith("ek_") and len(key) > 40
    assert body["prefix"] == key[:9] and body["scopes"] == ["read"] and body["tenant"] == "a"
    stored = db.execute("SELECT key_hash, prefix FROM api_keys").fetchall()
    assert stored == [(hashlib.sha256(key.encode()).digest(), key[:9])]
    assert key not in str(db.execute("SELECT * FROM api_keys").fetchall())
    listed = api.request("GET", "/v1/tenants/a/keys").json()["data"]
    assert [set(k) for k in listed] == [
        {"id", "name", "prefix", "scopes", "created_at", "last_used_at", "tenant"}]


def test_a_key_reaches_its_own_tenant_on_scoped_and_unscoped_paths(api: IngressProcess
                                                                  ) -> None:
    make_tenant(api, "a")
    key = make_key(api, "a")
    made = as_key(api, key, "POST", "/v1/destinations", {"url": "http://127.0.0.1:9/"})
    assert made.status == 201 and made.json()["tenant"] == "a"
    scoped = as_key(api, key, "GET", "/v1/tenants/a/destinations").json()["data"]
    unscoped = as_key(api, key, "GET", "/v1/destinations").json()["data"]
    assert [d["id"] for d in scoped] == [d["id"] for d in unscoped] == [made.json()["id"]]
    # The admin's unscoped paths are the default tenant's.
    assert api.request("GET", "/v1/destinations").json()["data"] == []
    admin_view = api.request("GET", "/v1/tenants/a/destinations").json()["data"]
    assert [d["id"] for d in admin_view] == [made.json()["id"]]


def test_events_fan_out_within_their_tenant_only(api: IngressProcess, db: psycopg.Connection
                                                 ) -> None:
    make_tenant(api, "a")
    make_tenant(api, "b")
    a = api.request("POST", "/v1/tenants/a/destinations", {"url": "http://127.0.0.1:9/a"}).json()
    api.request("POST", "/v1/tenants/b/destinations", {"url": "http://127.0.0.1:9/b"})
    api.request("POST", "/v1/destinations", {"url": "http://127.0.0.1:9/default"})
    accepted = api.request("POST", "/v1/tenants/a/events", {"type": "x", "payload": {}})
    assert accepted.json()["deliveries"] == 1
    rows = db.execute("SELECT destination_id, tenant_id FROM deliveries").fetchall()
    tenant_a = db.execute("SELECT id FROM tenants WHERE uid = 'a'").fetchone()
    assert rows == [(a["id"], tenant_a[0] if tenant_a else None)]
    event = api.request("GET", f"/v1/tenants/a/events/{accepted.json()['id']}").json()
    assert event["tenant"] == "a" and [d["tenant"] for d in event["deliveries"]] == ["a"]


def test_idempotency_keys_are_per_tenant(api: IngressProcess) -> None:
    make_tenant(api, "a")
    make_tenant(api, "b")
    send = {"type": "x", "payload": {"n": 1}}
    first = api.request("POST", "/v1/tenants/a/events", send, headers={"Idempotency-Key": "k1"})
    other = api.request("POST", "/v1/tenants/b/events", {"type": "y", "payload": {}},
                        headers={"Idempotency-Key": "k1"})
    assert first.status == other.status == 202
    assert first.json()["id"] != other.json()["id"]


def test_scopes_are_enforced(api: IngressProcess) -> None:
    make_tenant(api, "a")
    reader = make_key(api, "a", scopes=["read"])
    sender = make_key(api, "a", scopes=["send"])
    assert_error(as_key(api, reader, "POST", "/v1/events", {"type": "x", "payload": {}}),
                 403, "send")
    assert_error(as_key(api, reader, "POST", "/v1/destinations",
                        {"url": "http://127.0.0.1:9/"}), 403, "manage")
    assert as_key(api, reader, "GET", "/v1/destinations").status == 200
    assert as_key(api, sender, "POST", "/v1/events", {"type": "x", "payload": {}}).status == 202
    assert_error(as_key(api, sender, "GET", "/v1/events"), 403, "read")


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/tenants"), ("POST", "/v1/tenants"), ("GET", "/v1/tenants/a"),
    ("PATCH", "/v1/tenants/a"), ("DELETE", "/v1/tenants/a"), ("GET", "/v1/tenants/a/keys"),
    ("POST", "/v1/tenants/a/keys"), ("DELETE", "/v1/tenants/a/keys/1"),
    ("GET", "/v1/overview"), ("GET", "/metrics"),
])
def test_admin_routes_refuse_a_tenant_key(api: IngressProcess, db: psycopg.Connection,
                                          method: str, path: str) -> None:
    make_tenant(api, "a")
    key = make_key(api, "a")
    before = db.execute("SELECT count(*), max(revoked_at) FROM api_keys").fetchone()
    assert_error(as_key(api, key, method, path, {"uid": "x", "name": "x"}), 403, "admin")
    assert db.execute("SELECT count(*), max(revoked_at) FROM api_keys").fetchone() == before
    assert count(db, "tenants") == 2


def test_other_tenants_paths_and_objects_are_404(api: IngressProcess) -> None:
    make_tenant(api, "a")
    make_tenant(api, "b")
    key_a = make_key(api, "a")
    b_dest = api.request("POST", "/v1/tenants/b/destinations",
                         {"url": "http://127.0.0.1:9/"}).json()
    assert_error(as_key(api, key_a, "GET", "/v1/tenants/b/destinations"), 404, "tenant")
    assert_error(as_key(api, key_a, "GET", "/v1/tenants/nope/destinations"), 404, "tenant")
    assert_error(as_key(api, key_a, "GET", f"/v1/destinations/{b_dest['id']}"), 404)
    assert_error(as_key(api, key_a, "DELETE", f"/v1/destinations/{b_dest['id']}"), 404)
    assert api.request("GET", f"/v1/tenants/b/destinations/{b_dest['id']}").status == 200


@pytest.mark.parametrize(("uid", "why"), [
    ("", "uid"), ("a" * 65, "uid"), ("has space", "uid"), ("sl/ash", "uid"), ("é", "uid"),
    ("trailing-newline\n", "uid"),
])
def test_bad_uids_are_refused(api: IngressProcess, db: psycopg.Connection, uid: str,
                              why: str) -> None:
    assert_error(api.request("POST", "/v1/tenants", {"uid": uid}), 422, why)
    assert count(db, "tenants") == 1


@pytest.mark.parametrize("metadata", [{"a": "\x00"}, {"\x00": 1}, {"a": [[{"b": "x\x00y"}]]}])
def test_metadata_with_nul_is_refused(api: IngressProcess, db: psycopg.Connection,
                                      metadata: dict) -> None:
    assert_error(api.request("POST", "/v1/tenants", {"uid": "a", "metadata": metadata}),
                 422, "NUL")
    assert_error(api.request("PATCH", "/v1/tenants/default", {"metadata": metadata}),
                 422, "NUL")
    assert count(db, "tenants") == 1
    # A backslash followed by "u0000" is text, not NUL.
    assert make_tenant(api, "b", metadata={"a": "\\u0000"})["metadata"] == {"a": "\\u0000"}


def test_a_duplicate_uid_is_409(api: IngressProcess, db: psycopg.Connection) -> None:
    make_tenant(api, "a")
    assert_error(api.request("POST", "/v1/tenants", {"uid": "a"}), 409, "exists")
    assert count(db, "tenants") == 2


def test_a_listed_destination_of_another_tenant_is_422_naming_it(
    api: IngressProcess, db: psycopg.Connection,
) -> None:
    make_tenant(api, "a")
    make_tenant(api, "b")
    b_dest = api.request("POST", "/v1/tenants/b/destinations",
                         {"url": "http://127.0.0.1:9/"}).json()
    answer = api.request("POST", "/v1/tenants/a/events",
                         {"type": "x", "payload": {}, "destination_ids": [b_dest["id"]]})
    assert_error(answer, 422, str(b_dest["id"]))
    assert count(db, "events") == count(db, "deliveries") == 0


def test_a_key_of_a_deleted_tenant_is_401(api: IngressProcess, db: psycopg.Connection) -> None:
    make_tenant(api, "a")
    key = make_key(api, "a")
    api.request("POST", "/v1/tenants/a/destinations", {"url": "http://127.0.0.1:9/"})
    for _ in range(3):
        api.request("POST", "/v1/tenants/a/events", {"type": "x", "payload": {}})
    assert as_key(api, key, "GET", "/v1/destinations").status == 200
    assert api.request("DELETE", "/v1/tenants/a").status == 204
    assert_error(as_key(api, key, "GET", "/v1/destinations"), 401)
    assert count(db, "deliveries") == 0
    live = db.execute("SELECT count(*) FROM destinations WHERE deleted_at IS NULL").fetchone()
    assert live == (0,)


def test_the_default_tenant_cannot_be_deleted(api: IngressProcess) -> None:
    assert_error(api.request("DELETE", "/v1/tenants/default"), 409, "default")


def test_a_disabled_tenants_keys_are_refused(api: IngressProcess) -> None:
    make_tenant(api, "a")
    key = make_key(api, "a")
    api.request("PATCH", "/v1/tenants/a", {"disabled": True})
    assert_error(as_key(api, key, "GET", "/v1/destinations"), 403, "disabled")
    api.request("PATCH", "/v1/tenants/a", {"disabled": False})
    assert as_key(api, key, "GET", "/v1/destinations").status == 200


def test_last_used_at_is_written_without_a_write_per_request(
    api: IngressProcess, db: psycopg.Connection,
) -> None:
    make_tenant(api, "a")
    key = make_key(api, "a")
    updates_before = db.execute(
        "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'api_keys'").fetchone()
    for _ in range(30):
        assert as_key(api, key, "GET", "/v1/destinations").status == 200
    deadline = time.monotonic() + 15
    used = None
    while time.monotonic() < deadline:
        used = db.execute("SELECT last_used_at FROM api_keys").fetchone()
        if used and used[0] is not None:
            break
        time.sleep(0.2)
    assert used and used[0] is not None, "last_used_at never written"
    time.sleep(1)  # the statistics collector reports with a delay
    updates_after = db.execute(
        "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'api_keys'").fetchone()
    assert updates_before and updates_after
    assert updates_after[0] - updates_before[0] <= 3, "a write per request"


@pytest.fixture
def second_ingress(server: IngressProcess, module_dsn: str) -> Iterator[IngressProcess]:
    with IngressProcess(module_dsn, token=TOKEN) as process:
        yield process


def test_revocation_reaches_every_ingress_process_within_a_second(
    api: IngressProcess, second_ingress: IngressProcess,
) -> None:
    make_tenant(api, "a")
    key = make_key(api, "a")
    # Both processes know the key (the second learns it on its first miss or refresh).
    assert as_key(second_ingress, key, "GET", "/v1/destinations").status == 200
    assert as_key(api, key, "GET", "/v1/destinations").status == 200
    key_id = api.request("GET", "/v1/tenants/a/keys").json()["data"][0]["id"]
    assert api.request("DELETE", f"/v1/tenants/a/keys/{key_id}").status == 204
    revoked_at = time.monotonic()
    refused: dict[str, float] = {}
    while len(refused) < 2 and time.monotonic() - revoked_at < 5:
        for name, process in (("first", api), ("second", second_ingress)):
            if name not in refused and as_key(process, key, "GET",
                                              "/v1/destinations").status == 401:
                refused[name] = time.monotonic() - revoked_at
        time.sleep(0.02)
    assert set(refused) == {"first", "second"}, refused
    assert max(refused.values()) < 1.0, refused


def test_a_key_check_costs_no_query_per_request(api: IngressProcess, db: psycopg.Connection
                                                ) -> None:
    """/openapi.json reads nothing from the database: with a tenant key, only the key
    ring's own refreshes (a few a second) may reach it, however many requests come."""
    make_tenant(api, "a")
    key = make_key(api, "a")
    assert as_key(api, key, "GET", "/openapi.json").status == 200

    def commits() -> int:
        row = db.execute("SELECT xact_commit FROM pg_stat_database"
                         " WHERE datname = current_database()").fetchone()
        db.execute("SELECT pg_stat_clear_snapshot()")
        assert row is not None
        return int(row[0])

    before, started = commits(), time.monotonic()
    for _ in range(400):
        assert as_key(api, key, "GET", "/openapi.json").status == 200
    time.sleep(1)  # statistics are reported with a delay
    elapsed = time.monotonic() - started
    spent = commits() - before
    # The key ring's refreshes (4 a second) and the process's other timers, whatever the
    # machine's speed: far fewer than one per request.
    assert spent < 100, f"{spent} transactions for 400 requests in {elapsed:.1f} s"


def test_every_timestamp_is_declared_date_time(api: IngressProcess) -> None:
    import datetime as dt

    import msgspec

    from engine.ingress.openapi import DOCUMENTED

    document = api.request("GET", "/openapi.json").json()
    schemas = document["components"]["schemas"]
    checked = 0
    for op in DOCUMENTED:
        for model in (op.request, op.response):
            if model is None:
                continue
            for struct in _structs(msgspec.inspect.type_info(model)):
                properties = schemas[struct.cls.__name__]["properties"]
                for field in struct.fields:
                    if _is_datetime(field.type, dt):
                        declared = properties[field.encode_name]
                        options = declared.get("anyOf", [declared])
                        assert any(o.get("format") == "date-time" for o in options), (
                            struct.cls.__name__, field.name, declared)
                        checked += 1
    assert checked >= 15


def _structs(info: object, seen: set | None = None) -> list:
    import msgspec

    seen = set() if seen is None else seen
    found = []
    if isinstance(info, msgspec.inspect.Metadata):
        return _structs(info.type, seen)
    if isinstance(info, msgspec.inspect.StructType):
        if info.cls in seen:
            return []
        seen.add(info.cls)
        found.append(info)
        for field in info.fields:
            found += _structs(field.type, seen)
    for attr in ("item_type", "types", "value_type"):
        inner = getattr(info, attr, None)
        for one in inner if isinstance(inner, tuple) else [inner] if inner else []:
            found += _structs(one, seen)
    return found


def _is_datetime(info: object, dt: object) -> bool:
    import msgspec

    if isinstance(info, msgspec.inspect.Metadata):
        return _is_datetime(info.type, dt)
    if isinstance(info, msgspec.inspect.DateTimeType):
        return True
    if isinstance(info, msgspec.inspect.UnionType):
        return any(_is_datetime(t, dt) for t in info.types)
    return False

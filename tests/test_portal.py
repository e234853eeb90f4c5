"""Portal links over real HTTP (SPEC, "Customer portal and event-type catalog"; issue 40
items 1 and 5): a signed, short-lived link names one tenant, its expiry and whether it may
change anything; its signing key is kept in the database, shared by every ingress process
and rotatable; expired, changed and other tenants' links are 401 with a page saying which.
The browser side is tests/test_portal_browser.py; the cross-tenant sweep over every route
(portal tokens among the callers) is tests/test_tenant_isolation.py."""

from __future__ import annotations

import datetime as dt
import time
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

from engine.cli import main as cli_main
from engine.ingress import portal_tokens
from engine.testing.ingress_server import Answer, IngressProcess
from tests.kit.api import assert_error, count

TOKEN = "admin-token-for-portal-tests"


@pytest.fixture(scope="module")
def ingress_token() -> str:
    return TOKEN


def as_bearer(api: IngressProcess, token: str, method: str, path: str,
              body: object = None) -> Answer:
    return api.request(method, path, body, auth=False,
                       headers={"Authorization": f"Bearer {token}"})


def make_tenant(api: IngressProcess, uid: str) -> dict:
    answer = api.request("POST", "/v1/tenants", {"uid": uid})
    assert answer.status == 201, answer
    return answer.json()


def portal_link(api: IngressProcess, tenant: str, **fields: object) -> dict:
    answer = api.request("POST", f"/v1/tenants/{tenant}/portal", fields)
    assert answer.status == 201, answer
    return answer.json()


def token_of(link: dict) -> str:
    return parse_qs(urlsplit(link["url"]).query)["token"][0]


def page(api: IngressProcess, path_and_query: str) -> Answer:
    return api.request("GET", path_and_query, auth=False)


def test_a_link_opens_its_tenants_portal_and_reaches_only_that_tenant(
        api: IngressProcess) -> None:
    make_tenant(api, "acme")
    make_tenant(api, "other")
    mine = api.request("POST", "/v1/tenants/acme/destinations",
                       {"url": "http://127.0.0.1:9/acme"}).json()
    theirs = api.request("POST", "/v1/tenants/other/destinations",
                         {"url": "http://127.0.0.1:9/other"}).json()
    link = portal_link(api, "acme")
    assert link["tenant"] == "acme" and link["read_only"] is False
    where = urlsplit(link["url"])
    assert where.path == "/portal/acme" and where.netloc == urlsplit(api.base_url).netloc
    opened = page(api, f"{where.path}?{where.query}")
    assert opened.status == 200, opened
    assert b'data-mode="portal"' in opened.body
    assert "frame-ancestors 'none'" in opened.headers["content-security-policy"]
    token = token_of(link)
    session = as_bearer(api, token, "GET", "/v1/session").json()
    assert (session["kind"], session["tenant"], session["read_only"]) == ("portal", "acme", False)
    assert abs(time.time() + 3600 - _unix(session["expires_at"])) < 60
    listed = as_bearer(api, token, "GET", "/v1/destinations").json()["data"]
    assert [d["id"] for d in listed] == [mine["id"]]
    assert as_bearer(api, token, "GET", f"/v1/destinations/{theirs['id']}").status == 404
    # A write of its own tenant's destination goes through.
    patched = as_bearer(api, token, "PATCH", f"/v1/destinations/{mine['id']}", {"paused": True})
    assert patched.status == 200 and patched.json()["paused"] is True
    # The admin's routes, and events of its own, are not the portal's.
    assert_error(as_bearer(api, token, "GET", "/v1/tenants"), 403, "admin")
    assert_error(as_bearer(api, token, "POST", "/v1/tenants/acme/portal", {}), 403, "admin")
    assert_error(as_bearer(api, token, "POST", "/v1/events", {"type": "a", "payload": {}}),
                 403, "portal link")


def _unix(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_read_only_link_reads_and_every_write_is_refused(api: IngressProcess,
                                                           db: psycopg.Connection) -> None:
    make_tenant(api, "acme")
    mine = api.request("POST", "/v1/tenants/acme/destinations",
                       {"url": "http://127.0.0.1:9/acme"}).json()
    token = token_of(portal_link(api, "acme", read_only=True))
    assert as_bearer(api, token, "GET", "/v1/destinations").status == 200
    assert as_bearer(api, token, "GET", "/v1/session").json()["read_only"] is True
    before = db.execute("SELECT * FROM destinations ORDER BY id").fetchall()
    writes = [("PATCH", f"/v1/destinations/{mine['id']}", {"paused": True}),
              ("DELETE", f"/v1/destinations/{mine['id']}", None),
              ("POST", "/v1/destinations", {"url": "http://127.0.0.1:9/new"}),
              ("POST", f"/v1/destinations/{mine['id']}/replay", {}),
              ("POST", "/v1/deliveries/1/replay", None),
              ("POST", "/v1/events", {"type": "a", "payload": {}})]
    for method, path, body in writes:
        assert_error(as_bearer(api, token, method, path, body), 403, "read-only")
    assert db.execute("SELECT * FROM destinations ORDER BY id").fetchall() == before


@pytest.mark.parametrize("change", ["expired", "tampered", "other tenant", "no token",
                                    "rotated"])
def test_a_refused_link_is_401_with_a_page_saying_which(api: IngressProcess, change: str,
                                                        module_dsn: str) -> None:
    make_tenant(api, "acme")
    make_tenant(api, "other")
    link = portal_link(api, "acme", expires_in=1 if change == "expired" else 3600)
    token = token_of(link)
    path = "/portal/acme"
    if change == "expired":
        time.sleep(1.1)
    elif change == "tampered":
        # The tenant id changed to the other tenant's: the signature no longer matches.
        key, _, rest = token.split(".", 2)
        other_id = api.request("GET", "/v1/tenants/other").json()["id"]
        token = f"{key}.{other_id}.{rest}"
    elif change == "other tenant":
        path = "/portal/other"
    elif change == "rotated":
        assert cli_main(["--dsn", module_dsn, "portal", "rotate-key"]) == 0
    expected = {"expired": portal_tokens.EXPIRED, "tampered": portal_tokens.TAMPERED,
                "rotated": portal_tokens.TAMPERED, "other tenant": portal_tokens.OTHER_TENANT,
                "no token": "the portal link has no token"}[change]
    deadline = time.monotonic() + 2  # a rotation reaches the process within a refresh
    while True:
        refused = page(api, path if change == "no token" else f"{path}?token={token}")
        if refused.status == 401 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert refused.status == 401, refused
    assert refused.headers["content-type"].startswith("text/html")
    assert expected.encode() in refused.body.replace(b"&#x27;", b"'")
    if change != "no token":
        api_answer = as_bearer(api, token, "GET",
                               "/v1/tenants/other/destinations" if change == "other tenant"
                               else "/v1/destinations")
        assert_error(api_answer, 401, expected)


def test_the_signing_key_is_kept_in_the_database_and_shared_by_every_process(
        api: IngressProcess, db: psycopg.Connection, module_dsn: str) -> None:
    make_tenant(api, "acme")
    assert count(db, "portal_signing_keys") == 0
    token = token_of(portal_link(api, "acme"))
    assert count(db, "portal_signing_keys") == 1
    # Another process (a restart, another host) takes the link made by the first.
    with IngressProcess(module_dsn, token=TOKEN) as second:
        assert as_bearer(second, token, "GET", "/v1/session").json()["tenant"] == "acme"
        # ...and a link it makes is taken by the first: one key, not one each.
        other = token_of(portal_link(second, "acme"))
        assert as_bearer(api, other, "GET", "/v1/session").status == 200
    assert count(db, "portal_signing_keys") == 1


def test_rotating_the_key_ends_every_link_on_every_process_within_a_second(
        api: IngressProcess, db: psycopg.Connection, module_dsn: str) -> None:
    make_tenant(api, "acme")
    old = token_of(portal_link(api, "acme"))
    assert cli_main(["--dsn", module_dsn, "portal", "rotate-key"]) == 0
    rotated_at = time.monotonic()
    while as_bearer(api, old, "GET", "/v1/session").status != 401:
        assert time.monotonic() - rotated_at < 1.0, "the old link still works"
        time.sleep(0.02)
    new = token_of(portal_link(api, "acme"))
    assert as_bearer(api, new, "GET", "/v1/session").status == 200
    live = db.execute("SELECT count(*) FROM portal_signing_keys WHERE retired_at IS NULL"
                      ).fetchone()
    assert live == (1,) and count(db, "portal_signing_keys") == 2


def test_a_deleted_or_disabled_tenants_link_is_refused(api: IngressProcess) -> None:
    make_tenant(api, "gone")
    make_tenant(api, "off")
    gone, off = token_of(portal_link(api, "gone")), token_of(portal_link(api, "off"))
    assert as_bearer(api, gone, "GET", "/v1/destinations").status == 200
    assert api.request("DELETE", "/v1/tenants/gone").status == 204
    assert api.request("PATCH", "/v1/tenants/off", {"disabled": True}).status == 200
    time.sleep(0.6)  # the generation moved: every process re-reads the tenants it keeps
    assert_error(as_bearer(api, gone, "GET", "/v1/destinations"), 401, "no longer exists")
    assert_error(as_bearer(api, off, "GET", "/v1/destinations"), 403, "disabled")


@pytest.mark.parametrize(("body", "mentions"), [
    ({"expires_in": 7 * 86400 + 1}, "expires_in"),
    ({"expires_in": 0}, "expires_in"),
    ({"expires_in": "1h"}, "expires_in"),
    ({"read_only": "yes"}, "read_only"),
    ({"scopes": ["read"]}, "scopes"),
])
def test_bad_link_requests_are_422_and_write_nothing(api: IngressProcess, db: psycopg.Connection,
                                                     body: dict, mentions: str) -> None:
    make_tenant(api, "acme")
    assert_error(api.request("POST", "/v1/tenants/acme/portal", body), 422, mentions)
    assert count(db, "portal_signing_keys") == 0


def test_links_are_the_admins_alone(api: IngressProcess) -> None:
    make_tenant(api, "acme")
    key = api.request("POST", "/v1/tenants/acme/keys", {"name": "k"}).json()["key"]
    assert_error(as_bearer(api, key, "POST", "/v1/tenants/acme/portal", {}), 403, "admin")
    assert_error(api.request("POST", "/v1/tenants/nobody/portal", {}), 404, "tenant")


def test_frame_ancestors_come_from_the_setting(module_dsn: str) -> None:
    with IngressProcess(module_dsn, token=TOKEN, args=[
            "--portal-frame-ancestors", "https://app.example.com,'self'"]) as framed:
        framed.request("POST", "/v1/tenants", {"uid": "acme"})
        link = portal_link(framed, "acme")
        where = urlsplit(link["url"])
        opened = page(framed, f"{where.path}?{where.query}")
        policy = opened.headers["content-security-policy"]
        assert "frame-ancestors https://app.example.com 'self';" in policy
        # The operator's console stays unframeable.
        console = page(framed, "/console")
        assert "frame-ancestors 'none'" in console.headers["content-security-policy"]


def test_a_test_event_carries_the_catalogs_example_to_one_destination(
        api: IngressProcess, db: psycopg.Connection) -> None:
    make_tenant(api, "acme")
    assert api.request("POST", "/v1/event-types", {
        "name": "order.paid", "schema": {"type": "object", "required": ["id"]},
        "example": {"id": 7, "note": "example"}}).status == 201
    first, second = (api.request("POST", "/v1/tenants/acme/destinations",
                                 {"url": f"http://127.0.0.1:9/{n}"}).json() for n in range(2))
    token = token_of(portal_link(api, "acme"))
    sent = as_bearer(api, token, "POST", f"/v1/destinations/{first['id']}/test",
                     {"type": "order.paid"})
    assert sent.status == 202 and sent.json()["deliveries"] == 1, sent
    event = db.execute("SELECT type, payload::jsonb FROM events WHERE id = %s",
                       [sent.json()["id"]]).fetchone()
    assert event == ("order.paid", {"id": 7, "note": "example"})
    assert db.execute("SELECT destination_id FROM deliveries WHERE event_id = %s",
                      [sent.json()["id"]]).fetchall() == [(first["id"],)]
    # A type without an example sends {}; a payload given is sent as given, and checked
    # against the type's schema as any event is.
    plain = as_bearer(api, token, "POST", f"/v1/destinations/{second['id']}/test",
                      {"type": "ping"})
    assert plain.status == 202, plain
    assert db.execute("SELECT payload::text FROM events WHERE id = %s",
                      [plain.json()["id"]]).fetchone() == ("{}",)
    assert_error(as_bearer(api, token, "POST", f"/v1/destinations/{first['id']}/test",
                           {"type": "order.paid", "payload": {"no": "id"}}), 422, "required")


def test_a_test_event_to_another_tenants_destination_or_by_a_read_only_link_is_refused(
        api: IngressProcess, db: psycopg.Connection) -> None:
    make_tenant(api, "acme")
    make_tenant(api, "other")
    theirs = api.request("POST", "/v1/tenants/other/destinations",
                         {"url": "http://127.0.0.1:9/other"}).json()
    mine = api.request("POST", "/v1/tenants/acme/destinations",
                       {"url": "http://127.0.0.1:9/acme"}).json()
    token = token_of(portal_link(api, "acme"))
    assert_error(as_bearer(api, token, "POST", f"/v1/destinations/{theirs['id']}/test",
                           {"type": "ping"}), 404, "destination")
    read_only = token_of(portal_link(api, "acme", read_only=True))
    assert_error(as_bearer(api, read_only, "POST", f"/v1/destinations/{mine['id']}/test",
                           {"type": "ping"}), 403, "read-only")
    assert count(db, "events") == 0

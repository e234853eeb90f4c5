"""The customer portal in a real browser (issue 40 item 4): Debian's chromium driven by
playwright against a real engine (supervisor, worker, ingress) with two tenants, A
("acme") and B ("globex"), each with its own destinations and deliveries.

A link for A shows A's objects alone, its edits change A's destination and nothing of
B's, a test event reaches A's endpoint signed with A's secret, an expired and a changed
link each get the 401 page, a read-only link has no enabled write control and the API
refuses its writes, and a page of an origin not allowed cannot frame the portal.

Screenshots of each portal page go under pytest's tmp dir; ENGINE_PORTAL_SCREENSHOTS=DIR
keeps them (docs/portal/ was made so)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

from engine.testing.ingress_server import IngressProcess
from engine.webhooks.signing import sign
from tests.kit.enginerun import Engine, wait_until

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# As the console's browser tests: skipped without chromium outside CI, a failure in CI.
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed (bash tools/setup.sh test)",
                allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="the test extra: pip install playwright")

from playwright.sync_api import Page, expect  # noqa: E402

# The console's browser and page (a page fails its test on any script error) and HTTP client.
from tests.test_console_browser import browser, client_of, page  # noqa: E402

__all__ = ["browser", "page"]  # fixtures, shared with test_console_browser

TOKEN = "portal-browser-token"
WAIT_S = 60


class _Receiver(BaseHTTPRequestHandler):
    """Every destination's endpoint: answers 204 and keeps what came (path, headers,
    body). GET /frame?src=URL is a page of this (other) origin that frames URL."""

    protocol_version = "HTTP/1.1"
    received: ClassVar[list[tuple[str, dict[str, str], bytes]]] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.received.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        src = parse_qs(urlsplit(self.path).query).get("src", [""])[0]
        page = (f'<!doctype html><title>embedder</title><iframe id="portal" src="{src}"'
                ' width="900" height="500"></iframe>').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)


@pytest.fixture(scope="module")
def receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def made(client: IngressProcess, path: str, body: object) -> Any:
    answer = client.request("POST", path, body)
    assert answer.status in (201, 202), answer
    return answer.json()


@pytest.fixture(scope="module")
def world(module_dsn: str, receiver: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[dict[str, Any]]:
    logs = tmp_path_factory.mktemp("portal-engine")
    saved = os.environ.get("ENGINE_API_TOKEN")
    os.environ["ENGINE_API_TOKEN"] = TOKEN
    try:
        engine = Engine(module_dsn, logs, "--procs", "1", "--bind", "127.0.0.1:0",
                        "--allow-private-targets", "--retry-schedule", "1s")
        engine.__enter__()
    finally:
        if saved is None:
            os.environ.pop("ENGINE_API_TOKEN")
        else:
            os.environ["ENGINE_API_TOKEN"] = saved
    try:
        client = client_of(engine, TOKEN)
        made(client, "/v1/event-types", {
            "name": "order.paid", "description": "An order was paid for.",
            "schema": {"type": "object", "required": ["order"],
                       "properties": {"order": {"type": "integer"},
                                      "tenant": {"type": "string"}}},
            "example": {"order": 1001, "tenant": "example"}})
        made(client, "/v1/event-types", {"name": "order.refunded",
                                         "description": "An order was refunded."})
        tenants: dict[str, dict[str, Any]] = {}
        for uid in ("acme", "globex"):
            made(client, "/v1/tenants", {"uid": uid, "name": uid.title()})
            destinations = [made(client, f"/v1/tenants/{uid}/destinations",
                                 {"url": f"{receiver}/{uid}/{n}"}) for n in range(2)]
            made(client, f"/v1/tenants/{uid}/events/batch", {"events": [
                {"type": "order.paid", "payload": {"order": n, "tenant": uid}}
                for n in range(2)]})
            tenants[uid] = {"destinations": destinations}
        with psycopg.connect(module_dsn, autocommit=True) as db:
            wait_until(lambda: db.execute(
                "SELECT count(*) FROM finished_deliveries").fetchone() == (8,),
                WAIT_S, "the deliveries to arrive")
        yield {"engine": engine, "client": client, "tenants": tenants, "dsn": module_dsn,
               "receiver": receiver, "shots": tmp_path_factory.mktemp("portal-screenshots")}
    finally:
        engine.__exit__(None, None, None)


def screenshot(world: dict[str, Any], page: Page, name: str) -> None:
    path = world["shots"] / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    keep = os.environ.get("ENGINE_PORTAL_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)


def link(world: dict[str, Any], tenant: str, **fields: object) -> str:
    answer = world["client"].request("POST", f"/v1/tenants/{tenant}/portal", fields)
    assert answer.status == 201, answer
    url: str = answer.json()["url"]
    return url


def rows(world: dict[str, Any], query: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(world["dsn"], autocommit=True) as db:
        return db.execute(query, params).fetchall()


def ids_of(world: dict[str, Any], tenant: str) -> list[str]:
    return [str(d["id"]) for d in world["tenants"][tenant]["destinations"]]


def shown(page: Page, selector: str, attribute: str) -> list[str]:
    return page.eval_on_selector_all(
        selector, f"nodes => nodes.map(n => n.getAttribute('{attribute}'))")


def test_a_link_shows_its_tenants_destinations_and_deliveries_alone(
        world: dict[str, Any], page: Page) -> None:
    page.goto(link(world, "acme"))
    expect(page.locator("#create-destination")).to_be_visible()
    # The token left the address bar; the page is the console's, for one tenant.
    assert "token" not in page.url
    expect(page.locator('header nav a[data-page="tenants"]')).to_be_hidden()
    expect(page.locator("#tenant-select")).to_be_hidden()
    assert sorted(shown(page, "tr[data-destination]", "data-destination")) == ids_of(
        world, "acme")
    screenshot(world, page, "destinations")
    page.goto(page.url.split("#")[0] + "#/deliveries")
    expect(page.locator("tr[data-delivery]").first).to_be_visible()
    acme = {str(r[0]) for r in rows(world, "SELECT f.id FROM finished_deliveries f JOIN"
                                    " tenants t ON t.id = f.tenant_id WHERE t.uid = 'acme'")}
    assert set(shown(page, "tr[data-delivery]", "data-delivery")) == acme
    screenshot(world, page, "deliveries")
    page.click("tr[data-delivery] a")
    expect(page.locator("#replay")).to_be_visible()
    screenshot(world, page, "delivery")


def test_editing_through_the_portal_changes_its_tenants_destination_alone(
        world: dict[str, Any], page: Page) -> None:
    b_before = rows(world, "SELECT d.* FROM destinations d JOIN tenants t ON t.id ="
                           " d.tenant_id WHERE t.uid = 'globex' ORDER BY d.id")
    target = ids_of(world, "acme")[1]
    page.goto(link(world, "acme"))
    expect(page.locator("#create-destination")).to_be_visible()  # the first page shown
    page.goto(page.url.split("#")[0] + f"#/destination/{target}")
    form = page.locator("#edit-destination")
    expect(form).to_be_visible()
    form.locator('input[name="timeout_ms"]').fill("4321")
    form.locator('button[type="submit"]').click()
    expect(page.locator(".notice", has_text="Saved.")).to_be_visible()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click('button[data-action="pause"]')
    expect(page.locator("#destination-state")).to_contain_text("paused")
    screenshot(world, page, "destination")
    assert rows(world, "SELECT timeout_ms, paused FROM destinations WHERE id = %s",
                (int(target),)) == [(4321, True)]
    assert rows(world, "SELECT d.* FROM destinations d JOIN tenants t ON t.id ="
                       " d.tenant_id WHERE t.uid = 'globex' ORDER BY d.id") == b_before


@pytest.mark.parametrize("change", ["expired", "tampered"])
def test_an_expired_or_changed_link_shows_the_401_page(world: dict[str, Any], page: Page,
                                                       change: str) -> None:
    url = link(world, "acme", expires_in=1)
    if change == "expired":
        time.sleep(1.2)
        reason = "has expired"
    else:
        globex = rows(world, "SELECT id FROM tenants WHERE uid = 'globex'")[0][0]
        head, token = url.split("token=")
        key, _, rest = token.split(".", 2)
        url = f"{head}token={key}.{globex}.{rest}"
        reason = "not valid"
    answer = page.goto(url)
    assert answer is not None and answer.status == 401
    expect(page.locator("#portal-refused")).to_contain_text(reason)
    screenshot(world, page, f"refused-{change}")


def test_a_read_only_link_has_no_enabled_write_control_and_its_writes_are_refused(
        world: dict[str, Any], page: Page) -> None:
    page.goto(link(world, "acme", read_only=True))
    expect(page.locator("#create-destination")).to_be_visible()
    base = page.url.split("#")[0]
    write_controls = ("[data-write] input, [data-write] select, [data-write] textarea,"
                      " [data-write] button, button[data-action]")
    delivery = rows(world, "SELECT f.id FROM finished_deliveries f JOIN tenants t"
                           " ON t.id = f.tenant_id WHERE t.uid = 'acme' LIMIT 1")[0][0]
    for where in ("#/destinations", f"#/destination/{ids_of(world, 'acme')[0]}",
                  f"#/delivery/{delivery}"):
        page.goto(base + where)
        expect(page.locator("main h1")).to_be_visible()
        page.wait_for_timeout(300)
        enabled = page.eval_on_selector_all(
            write_controls, "nodes => nodes.filter(n => !n.disabled).map(n => n.outerHTML)")
        assert enabled == [], f"{where}: enabled write controls {enabled}"
        assert page.locator(write_controls).count() > 0, f"{where}: no write control found"
    screenshot(world, page, "read-only")
    # The API refuses what the page does not offer.
    status = page.evaluate(
        """async ([id, token]) => (await fetch(`/v1/destinations/${id}`, {method: "PATCH",
             headers: {authorization: `Bearer ${token}`, "content-type": "application/json"},
             body: JSON.stringify({paused: true})})).status""",
        [ids_of(world, "acme")[0], page.evaluate("sessionStorage.getItem('engine.api_token')")])
    assert status == 403


def test_a_page_of_an_origin_not_allowed_cannot_frame_the_portal(
        world: dict[str, Any], page: Page, module_dsn: str) -> None:
    refusals: list[str] = []
    page.on("console", lambda message: refusals.append(message.text))
    page.goto(f"{world['receiver']}/frame?src={link(world, 'acme')}")
    page.wait_for_timeout(1500)
    framed = page.frame_locator("#portal")
    assert framed.locator("#main").count() == 0, "the portal loaded inside the frame"
    assert any("frame-ancestors" in text for text in refusals), refusals
    # The control: an engine that allows this origin is framed.
    with IngressProcess(module_dsn, token=TOKEN, args=[
            "--portal-frame-ancestors", world["receiver"]]) as allowing:
        answer = allowing.request("POST", "/v1/tenants/acme/portal", {})
        page.goto(f"{world['receiver']}/frame?src={answer.json()['url']}")
        expect(page.frame_locator("#portal").locator("#create-destination")).to_be_visible()


def test_signatures_check_with_the_tenants_secret(world: dict[str, Any]) -> None:
    """What the fixture delivered is signed with each destination's own secret: the
    receiver's record is what the test event's check below relies on."""
    for tenant in ("acme", "globex"):
        for destination in world["tenants"][tenant]["destinations"]:
            path = urlsplit(destination["url"]).path
            got = [(h, b) for p, h, b in _Receiver.received if p == path]
            assert got, path
            headers, body = got[0]
            expected = sign([destination["secret"]], headers["webhook-id"],
                            int(headers["webhook-timestamp"]), body)
            assert headers["webhook-signature"] == expected


def test_a_test_event_reaches_the_tenants_endpoint_signed_with_its_secret(
        world: dict[str, Any], page: Page) -> None:
    destination = world["tenants"]["acme"]["destinations"][0]
    path = urlsplit(destination["url"]).path
    before = len([1 for p, _, _ in _Receiver.received if p == path])
    page.goto(link(world, "acme"))
    expect(page.locator("#create-destination")).to_be_visible()  # the first page shown
    page.goto(page.url.split("#")[0] + f"#/destination/{destination['id']}")
    form = page.locator("#test-event")
    expect(form).to_be_visible()
    form.locator("#test-type").select_option("order.paid")
    assert '"order": 1001' in form.locator("#test-payload").input_value()
    form.locator('button[type="submit"]').click()
    expect(page.locator("#test-sent")).to_be_visible()
    arrived = wait_until(lambda: [r for r in _Receiver.received if r[0] == path][before:],
                         WAIT_S, "the test event")
    _, headers, body = arrived[0]
    assert body == b'{"order":1001,"tenant":"example"}'
    assert headers["webhook-signature"] == sign(
        [destination["secret"]], headers["webhook-id"], int(headers["webhook-timestamp"]),
        body)
    # Nothing reached B's endpoints.
    globex = {urlsplit(d["url"]).path for d in world["tenants"]["globex"]["destinations"]}
    assert len([1 for p, _, _ in _Receiver.received if p in globex]) == 4
    screenshot(world, page, "test-event-sent")


def test_the_event_type_catalog_is_shown(world: dict[str, Any], page: Page) -> None:
    page.goto(link(world, "acme", read_only=True))
    # The first page rendered before the next is asked for: a page still loading when the
    # hash changes would be shown over it (the console's pages are not cancelled).
    expect(page.locator("#create-destination")).to_be_visible()
    page.goto(page.url.split("#")[0] + "#/event-types")
    expect(page.locator('tr[data-event-type="order.paid"] pre.example')).to_contain_text("1001")
    expect(page.locator('tr[data-event-type="order.refunded"]')).to_contain_text("refunded")
    screenshot(world, page, "event-types")

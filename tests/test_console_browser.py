"""The console in a real browser: Debian's chromium driven by playwright, against a real
engine (supervisor, worker, ingress) delivering to three loopback destinations: one
healthy, one failing (HTTP 500, its breaker opens), one dead (nothing listens).

Each test saves a screenshot of the page it checked (under pytest's tmp dir; set
ENGINE_CONSOLE_SCREENSHOTS=DIR to keep them, as docs/console/ was made)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine.testing.ingress_server import IngressProcess
from tests.kit.enginerun import Engine, wait_until
from tests.kit.httpserver_helpers import closed_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Outside CI a machine without chromium skips these tests; under CI a skip fails
# (tests/conftest.py), and .ci/run installs chromium first (tools/setup.sh test).
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed (bash tools/setup.sh test)",
                allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="the test extra: pip install playwright")

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

TOKEN = "console-browser-token"
SCRIPT = "<script>window.__pwned = 1</script>"
WAIT_S = 60


class _Destination(BaseHTTPRequestHandler):
    """/ok answers 204; /fail answers 500 with a body that holds a script tag."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        status, body = (204, b"") if self.path == "/ok" else (500, SCRIPT.encode())
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def destination_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Destination)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def client_of(engine: Engine, token: str | None) -> IngressProcess:
    [started] = wait_until(lambda: engine.events("supervisor_started"), WAIT_S, "supervisor")
    client = IngressProcess("unused", token=token)  # only its HTTP client: the engine serves
    client.port = int(started["bind"].rsplit(":", 1)[1])

    def healthy() -> bool:
        try:
            return client.request("GET", "/healthz", timeout=2).status == 200
        except OSError:
            return False

    wait_until(healthy, WAIT_S, "ingress to answer")
    return client


@pytest.fixture(scope="module")
def world(
    module_dsn: str, destination_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The engine, its destinations and their deliveries once everything has settled:
    healthy's delivered, dead's dead (4 failures: under the breaker threshold), failing's
    breaker open after 5 failures with its sixth attempt waiting for the probe."""
    logs = tmp_path_factory.mktemp("console-engine")
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
        ids = {}
        for name, url in (("healthy", f"{destination_server}/ok"),
                          ("failing", f"{destination_server}/fail"),
                          ("dead", f"http://127.0.0.1:{closed_port()}/gone")):
            answer = client.request("POST", "/v1/destinations", {"url": url})
            assert answer.status == 201, answer
            ids[name] = answer.json()["id"]
        events = (
            [{"type": "note.created", "payload": {"note": SCRIPT},
              "destination_ids": [ids["healthy"]]}]
            + [{"type": "order.paid", "payload": {"order": n},
                "destination_ids": [ids["healthy"]]} for n in range(2)]
            + [{"type": "order.paid", "payload": {"order": n},
                "destination_ids": [ids["failing"]]} for n in range(3)]
            + [{"type": "order.paid", "payload": {"order": n},
                "destination_ids": [ids["dead"]]} for n in range(2)]
        )
        answer = client.request("POST", "/v1/events/batch", {"events": events})
        assert answer.status == 202, answer
        with psycopg.connect(module_dsn, autocommit=True) as db:
            def settled() -> bool:
                counts = dict(db.execute(
                    "SELECT destination_id || ':' || status, count(*) FROM finished_deliveries"
                    " GROUP BY 1").fetchall())
                breaker = db.execute("SELECT breaker::text FROM destinations WHERE id = %s",
                                     (ids["failing"],)).fetchone()
                return (counts.get(f"{ids['healthy']}:delivered") == 3
                        and counts.get(f"{ids['dead']}:dead") == 2
                        and breaker == ("open",))
            wait_until(settled, WAIT_S, "the deliveries to settle")
        yield {"engine": engine, "client": client, "ids": ids, "dsn": module_dsn,
               "shots": tmp_path_factory.mktemp("console-screenshots")}
    finally:
        engine.__exit__(None, None, None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert not errors, errors  # no script error on any page


def screenshot(world: dict[str, Any], page: Page, name: str) -> None:
    path = world["shots"] / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    keep = os.environ.get("ENGINE_CONSOLE_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)


def open_console(world: dict[str, Any], page: Page, where: str = "overview") -> None:
    """Open the console at #/where and answer the token prompt."""
    page.goto(f"{world['client'].base_url}/console#/{where}")
    expect(page.locator("#token-prompt")).to_be_visible()
    page.fill("#token-input", TOKEN)
    page.click("#token-form button[type=submit]")
    expect(page.locator("#token-prompt")).to_be_hidden()


def db_rows(world: dict[str, Any], query: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(world["dsn"], autocommit=True) as db:
        return db.execute(query, params).fetchall()


def test_overview_numbers_match_the_database(world: dict[str, Any], page: Page) -> None:
    open_console(world, page)
    expect(page.locator("#per-minute")).to_be_visible()
    query = ("SELECT (SELECT count(*) FROM deliveries WHERE status = 'pending'),"
             " (SELECT count(*) FROM deliveries WHERE status = 'in_flight'),"
             " (SELECT count(*) FROM finished_deliveries WHERE status = 'dead'),"
             " (SELECT count(*) FROM destinations WHERE breaker <> 'closed')")

    def shown_matches() -> bool:
        # The database before and after the page read: equal, the page saw that state.
        before = db_rows(world, query)[0]
        page.reload()
        expect(page.locator("#depth-dead")).to_be_visible()
        shown = tuple(int(page.inner_text(f"#{name}")) for name in
                      ("depth-pending", "depth-in_flight", "depth-dead", "breakers-open"))
        return before == shown == db_rows(world, query)[0]

    wait_until(shown_matches, WAIT_S, "the overview to show the database's numbers")
    assert int(page.inner_text("#breakers-open")) == 1  # the failing destination
    screenshot(world, page, "overview")


def test_a_wrong_token_shows_the_prompt_and_no_data(world: dict[str, Any], page: Page) -> None:
    page.goto(f"{world['client'].base_url}/console#/destinations")
    expect(page.locator("#token-prompt")).to_be_visible()
    page.fill("#token-input", "not-the-token")
    page.click("#token-form button[type=submit]")
    expect(page.locator("#token-message")).to_contain_text("refused")
    expect(page.locator("#token-prompt")).to_be_visible()
    assert page.locator("[data-destination]").count() == 0
    assert page.evaluate("sessionStorage.getItem('engine.api_token')") is None
    screenshot(world, page, "wrong-token")


def test_pause_and_resume_a_destination_from_the_page(
    world: dict[str, Any], page: Page
) -> None:
    healthy = world["ids"]["healthy"]
    open_console(world, page, "destinations")
    row = page.locator(f"tr[data-destination='{healthy}']")
    row.locator("[data-action=pause]").click()
    expect(row.locator(".state")).to_contain_text("paused")
    assert db_rows(world, "SELECT paused FROM destinations WHERE id = %s", (healthy,)) == [
        (True,)]
    screenshot(world, page, "destinations-paused")
    row.locator("[data-action=resume]").click()
    expect(row.locator(".state")).not_to_contain_text("paused")
    assert db_rows(world, "SELECT paused FROM destinations WHERE id = %s", (healthy,)) == [
        (False,)]
    # The failing destination's row says why it fails.
    failing = page.locator(f"tr[data-destination='{world['ids']['failing']}']")
    expect(failing.locator("td.error")).to_contain_text("500")
    expect(failing.locator(".state")).to_contain_text("open")
    screenshot(world, page, "destinations")


def test_replay_a_dead_delivery_from_its_page(world: dict[str, Any], page: Page) -> None:
    [(delivery_id,)] = db_rows(
        world, "SELECT min(id) FROM finished_deliveries WHERE destination_id = %s"
               " AND status = 'dead'", (world["ids"]["dead"],))
    open_console(world, page, f"delivery/{delivery_id}")
    expect(page.locator("#delivery-status")).to_have_text("dead")
    attempts = page.locator("tr[data-attempt]")
    expect(attempts).to_have_count(2)
    expect(attempts.first.locator("td.error")).not_to_have_text("\u2013")
    page.click("#replay")
    # The live refresh brings the new attempt in without a reload.
    expect(attempts).to_have_count(3, timeout=WAIT_S * 1000)
    assert db_rows(world, "SELECT count(*) FROM delivery_attempts WHERE delivery_id = %s",
                   (delivery_id,))[0][0] >= 3
    screenshot(world, page, "delivery-replayed")


def test_script_in_a_payload_and_a_response_body_is_shown_as_text(
    world: dict[str, Any], page: Page
) -> None:
    [(delivery_id,)] = db_rows(
        world, "SELECT d.id FROM finished_deliveries d JOIN events e ON e.id = d.event_id"
               " WHERE e.type = 'note.created'")
    open_console(world, page, f"delivery/{delivery_id}")
    expect(page.locator("#payload")).to_contain_text(SCRIPT)
    assert page.locator("#payload script").count() == 0
    screenshot(world, page, "delivery-script-payload")
    [(failed_id,)] = db_rows(
        world, "SELECT min(id) FROM finished_deliveries WHERE destination_id = %s",
        (world["ids"]["failing"],)) or [(None,)]
    if failed_id is None:  # its last delivery may still wait for the probe
        [(failed_id,)] = db_rows(world, "SELECT min(id) FROM deliveries WHERE destination_id"
                                        " = %s", (world["ids"]["failing"],))
    page.goto(f"{world['client'].base_url}/console#/delivery/{failed_id}")
    expect(page.locator(".response-body").first).to_have_text(SCRIPT)
    assert page.locator("main script").count() == 0
    assert page.evaluate("window.__pwned") is None
    screenshot(world, page, "delivery-script-response")


def test_deliveries_filters_are_in_the_url_and_bulk_replay_confirms_the_count(
    world: dict[str, Any], page: Page
) -> None:
    dead = world["ids"]["dead"]
    open_console(world, page, f"deliveries?destination_id={dead}&status=dead")
    expect(page.locator("tr[data-delivery]").first).to_be_visible()
    [(dead_now,)] = db_rows(world, "SELECT count(*) FROM finished_deliveries"
                                   " WHERE destination_id = %s AND status = 'dead'", (dead,))
    expect(page.locator("tr[data-delivery]")).to_have_count(dead_now)
    page.select_option("#delivery-filters select[name=status]", "")
    page.fill("#delivery-filters input[name=event_type]", "order.paid")
    page.click("#delivery-filters button[type=submit]")
    expect(page).to_have_url(f"{world['client'].base_url}/console#/deliveries?"
                             f"destination_id={dead}&event_type=order.paid")
    screenshot(world, page, "deliveries")

    page.goto(f"{world['client'].base_url}/console#/destination/{dead}")
    page.click("#bulk-replay button[type=submit]")
    [(dead_now,)] = db_rows(world, "SELECT count(*) FROM finished_deliveries"
                                   " WHERE destination_id = %s AND status = 'dead'", (dead,))
    expect(page.locator("#replay-confirm")).to_contain_text(f"Replay {dead_now} dead")
    screenshot(world, page, "bulk-replay-confirm")
    page.click("[data-action=confirm-replay]")
    expect(page.locator("main")).to_contain_text(f"Replayed {dead_now} deliver")


def test_edit_a_destination_and_see_a_refused_value_next_to_its_field(
    world: dict[str, Any], page: Page
) -> None:
    client = world["client"]
    created = client.request("POST", "/v1/destinations",
                             {"url": "http://127.0.0.1:9/edited"}).json()
    open_console(world, page, f"destination/{created['id']}")
    form = page.locator("#edit-destination")
    form.locator("input[name=rate_limit]").fill("2.5")
    form.locator("input[name=retry_schedule]").fill("10s, 1m")
    form.locator("textarea[name=headers]").fill("X-Team: payments\nX-Env: test")
    form.locator("input[name=ordered]").check()
    form.locator("button[type=submit]").click()
    expect(page.locator("main .notice")).to_contain_text("Saved.")
    expect(page.locator("#destination-rate")).to_have_text("2.5 requests/s / ordered")
    expect(page.locator("#destination-schedule")).to_have_text("10s, 1m")
    assert db_rows(world, "SELECT rate_limit, retry_schedule, headers, ordered"
                          " FROM destinations WHERE id = %s", (created["id"],)) == [
        (2.5, [10.0, 60.0], {"X-Team": "payments", "X-Env": "test"}, True)]

    # A header the engine sets itself: the API refuses it, the form says so by the field,
    # and nothing changes.
    form = page.locator("#edit-destination")
    form.locator("textarea[name=headers]").fill("Content-Type: text/plain")
    form.locator("input[name=rate_limit]").fill("0")
    form.locator("button[type=submit]").click()
    error = form.locator("[data-error-for=rate_limit]")
    expect(error).to_contain_text("rate_limit")
    form.locator("input[name=rate_limit]").fill("2.5")
    form.locator("button[type=submit]").click()
    expect(form.locator("[data-error-for=headers]")).to_contain_text(
        "the engine sets this header itself")
    expect(form.locator("[data-error-for=rate_limit]")).to_be_empty()
    assert db_rows(world, "SELECT rate_limit, headers FROM destinations WHERE id = %s",
                   (created["id"],)) == [(2.5, {"X-Team": "payments", "X-Env": "test"})]
    screenshot(world, page, "destination-edit-refused")


def test_create_and_edit_a_destinations_channels_and_filter(
    world: dict[str, Any], page: Page
) -> None:
    open_console(world, page, "destinations")
    create = page.locator("#create-destination")
    create.locator("input[name=url]").fill("http://127.0.0.1:9/routed")
    create.locator("input[name=channels]").fill("eu, orders")
    create.locator("textarea[name=filter]").fill('{"customer.tier": {"$eq": "gold"}}')
    create.locator("button[type=submit]").click()
    expect(page.locator("main")).to_contain_text("127.0.0.1:9/routed")
    [(destination, filter_, channels)] = db_rows(
        world, "SELECT id, filter, channels FROM destinations WHERE url = %s",
        ("http://127.0.0.1:9/routed",))
    assert (filter_, channels) == ({"customer.tier": {"$eq": "gold"}}, ["eu", "orders"])

    page.click(f"a[href='#/destination/{destination}']")
    expect(page.locator("#destination-channels")).to_have_text("eu, orders")
    form = page.locator("#edit-destination")
    form.locator("textarea[name=filter]").fill('{"items.0.qty": {"$gt": 1}}')
    form.locator("input[name=channels]").fill("")
    form.locator("button[type=submit]").click()
    expect(page.locator("main .notice")).to_contain_text("Saved.")
    expect(page.locator("#destination-filter")).to_contain_text("items.0.qty")
    # The API's refusal of a bad operator is shown by the field; nothing changes.
    form = page.locator("#edit-destination")
    form.locator("textarea[name=filter]").fill('{"a": {"$like": "x"}}')
    form.locator("button[type=submit]").click()
    expect(form.locator("[data-error-for=filter]")).to_contain_text("unknown operator '$like'")
    assert db_rows(world, "SELECT filter, channels FROM destinations WHERE id = %s",
                   (destination,)) == [({"items.0.qty": {"$gt": 1}}, None)]
    screenshot(world, page, "destination-filter-refused")


def backlogs(world: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Each tenant's pending and in-flight deliveries, from the database."""
    return {uid: (pending, in_flight) for uid, pending, in_flight in db_rows(world, (
        "SELECT t.uid, count(*) FILTER (WHERE d.status = 'pending'),"
        " count(*) FILTER (WHERE d.status = 'in_flight')"
        " FROM tenants t LEFT JOIN deliveries d ON d.tenant_id = t.id"
        " WHERE t.deleted_at IS NULL GROUP BY t.uid"))}


def test_the_tenant_selector_filters_every_view_and_tenants_show_their_backlog(
    world: dict[str, Any], page: Page
) -> None:
    """Two tenants with paused destinations (their deliveries wait): choosing one shows
    its objects only, each row names its tenant, and the Tenants page counts each
    tenant's backlog as the database does."""
    client = world["client"]
    made: dict[str, dict[str, Any]] = {}
    for uid, events in (("tenant-a", 1), ("tenant-b", 2)):
        assert client.request("POST", "/v1/tenants", {"uid": uid}).status == 201
        base = f"/v1/tenants/{uid}"
        destination = client.request("POST", f"{base}/destinations",
                                     {"url": f"http://127.0.0.1:9/{uid}"}).json()
        assert client.request("PATCH", f"{base}/destinations/{destination['id']}",
                              {"paused": True}).status == 200
        sent = [client.request("POST", f"{base}/events",
                               {"type": f"{uid}.created", "payload": {"n": n}}).json()
                for n in range(events)]
        made[uid] = {"destination": destination["id"], "events": [e["id"] for e in sent]}

    open_console(world, page, "destinations")
    expect(page.locator(f"tr[data-destination='{world['ids']['healthy']}']")).to_be_visible()
    expect(page.locator("#tenant-note")).to_have_text("tenant default")
    rows = page.locator("tr[data-destination]")
    expect(rows.locator("td.tenant").first).to_have_text("default")
    assert set(rows.locator("td.tenant").all_inner_texts()) == {"default"}

    page.select_option("#tenant-select", "tenant-b")
    expect(page.locator("#tenant-note")).to_have_text("tenant tenant-b")
    expect(rows).to_have_count(1)
    expect(page.locator(f"tr[data-destination='{made['tenant-b']['destination']}'] td.tenant")
           ).to_have_text("tenant-b")
    screenshot(world, page, "destinations-tenant")

    page.click("header nav a[data-page=events]")
    events = page.locator("tr[data-event]")
    expect(events).to_have_count(2)
    assert sorted(int(e) for e in events.evaluate_all(
        "rows => rows.map(r => r.dataset.event)")) == sorted(made["tenant-b"]["events"])
    assert set(events.locator("td.tenant").all_inner_texts()) == {"tenant-b"}
    screenshot(world, page, "events-tenant")
    events.first.locator("a").first.click()
    expect(page.locator("#event-tenant")).to_have_text("tenant-b")

    page.click("header nav a[data-page=deliveries]")
    deliveries = page.locator("tr[data-delivery]")
    expect(deliveries).to_have_count(2)
    assert set(deliveries.locator("td.tenant").all_inner_texts()) == {"tenant-b"}
    deliveries.first.locator("a").first.click()
    expect(page.locator("#delivery-tenant")).to_have_text("tenant-b")
    # Switching tenant from an object's page goes to the other tenant's list.
    page.select_option("#tenant-select", "tenant-a")
    expect(page).to_have_url(f"{client.base_url}/console#/deliveries")
    expect(deliveries).to_have_count(1)
    assert deliveries.locator("td.tenant").all_inner_texts() == ["tenant-a"]

    def shown_matches() -> bool:
        # The database before and after the page read: equal, the page saw that state.
        before = backlogs(world)
        page.goto(f"{client.base_url}/console#/tenants")
        page.reload()
        expect(page.locator("tr[data-tenant='tenant-b']")).to_be_visible()
        shown = {
            row.get_attribute("data-tenant") or "": (
                int(row.locator("td.pending").inner_text()),
                int(row.locator("td.in-flight").inner_text()))
            for row in page.locator("tr[data-tenant]").all()}
        return before == shown == backlogs(world)

    wait_until(shown_matches, WAIT_S, "the Tenants page to show the database's backlogs")
    assert backlogs(world)["tenant-a"] == (1, 0)
    assert backlogs(world)["tenant-b"] == (2, 0)
    expect(page.locator("tr[data-tenant='tenant-a'] td").last).to_have_text("selected")
    screenshot(world, page, "tenants")

    # Paging with `next`: two a page.
    page.goto(f"{client.base_url}/console#/tenants?limit=2")
    tenants = page.locator("tr[data-tenant]")
    expect(tenants).to_have_count(2)
    assert tenants.evaluate_all("rows => rows.map(r => r.dataset.tenant)") == [
        "default", "tenant-a"]
    page.click("#next-tenants")
    expect(tenants).to_have_count(1)
    assert tenants.evaluate_all("rows => rows.map(r => r.dataset.tenant)") == ["tenant-b"]
    expect(page.locator("#next-tenants")).to_have_count(0)
    # Select from the Tenants page: the default tenant's destinations again.
    page.goto(f"{client.base_url}/console#/tenants")
    page.locator("tr[data-tenant='default'] [data-action=select-tenant]").click()
    page.click("header nav a[data-page=destinations]")
    expect(page.locator(f"tr[data-destination='{world['ids']['healthy']}']")).to_be_visible()
    expect(page.locator(f"tr[data-destination='{made['tenant-b']['destination']}']")
           ).to_have_count(0)


def test_a_tenant_key_sees_its_own_tenant_without_a_selector(
    world: dict[str, Any], page: Page
) -> None:
    client = world["client"]
    assert client.request("POST", "/v1/tenants", {"uid": "tenant-key"}).status == 201
    own = client.request("POST", "/v1/tenants/tenant-key/destinations",
                         {"url": "http://127.0.0.1:9/tenant-key"}).json()
    key = client.request("POST", "/v1/tenants/tenant-key/keys", {"name": "console"}).json()
    page.goto(f"{client.base_url}/console#/destinations")
    page.fill("#token-input", key["key"])
    page.click("#token-form button[type=submit]")
    rows = page.locator("tr[data-destination]")
    expect(rows).to_have_count(1)
    expect(rows.locator("td.tenant")).to_have_text("tenant-key")
    assert rows.get_attribute("data-destination") == str(own["id"])
    expect(page.locator("label.tenant-pick")).to_be_hidden()


def test_console_works_without_a_token_on_loopback(
    world: dict[str, Any], browser: Browser
) -> None:
    with IngressProcess(world["dsn"]) as ingress:  # ENGINE_API_TOKEN unset
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        page = context.new_page()
        page.goto(f"{ingress.base_url}/console")
        expect(page.locator("#depth-dead")).to_be_visible()
        assert page.locator("#token-prompt").is_hidden()
        context.close()

"""The fake destination itself: behaviours by path, counters, signatures, control calls."""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest
from standardwebhooks import Webhook

from engine.testing.fakedest import FakeDestination
from tests.kit.enginerun import wait_until

SECRET = "whsec_" + base64.b64encode(b"k" * 24).decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"o" * 24).decode()


@pytest.fixture(scope="module")
def dest() -> Iterator[FakeDestination]:
    with FakeDestination() as d:
        yield d


def post(
    dest: FakeDestination,
    path: str,
    body: bytes = b"{}",
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> http.client.HTTPResponse:
    # http.client rather than urllib: it never follows redirects and sends the body as given.
    conn = http.client.HTTPConnection("127.0.0.1", dest.port, timeout=timeout)
    conn.request("POST", "/" + path.lstrip("/"), body=body, headers=headers or {})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def signed_headers(msg_id: str, body: bytes, *secrets: str) -> dict[str, str]:
    now = datetime.now(tz=UTC)
    sigs = [Webhook(s).sign(msg_id, now, body.decode()) for s in secrets]
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": " ".join(sigs),
        "content-type": "application/json",
    }


def test_fast_counts_requests_and_ids(dest: FakeDestination) -> None:
    for i in range(5):
        assert post(dest, "fast/counts", headers={"webhook-id": f"msg_{i}"}).status == 200
    post(dest, "fast/counts")
    stats = dest.name_stats("counts")
    assert stats["requests"] == 6
    assert stats["responses"] == {"200": 6}
    assert stats["distinct_ids"] == 5
    assert stats["delivered_ids"] == 5
    assert stats["missing_id"] == 1
    assert stats["duplicates"] == 0
    assert stats["in_flight"] == 0
    assert set(dest.arrivals("counts")) == {f"msg_{i}" for i in range(5)}
    assert dest.stats()["totals"]["requests"] >= 6


def test_duplicate_2xx_is_reported(dest: FakeDestination) -> None:
    post(dest, "status/500/dup", headers={"webhook-id": "msg_dup"})
    post(dest, "fast/dup", headers={"webhook-id": "msg_dup"})
    # A failed attempt followed by a success is a retry, not a duplicate.
    assert dest.name_stats("dup")["duplicates"] == 0
    post(dest, "fast/dup", headers={"webhook-id": "msg_dup"})
    stats = dest.name_stats("dup")
    assert stats["duplicates"] == 1
    assert stats["duplicate_ids_sample"] == ["msg_dup"]
    assert stats["distinct_ids"] == 1


def test_signatures_checked_against_runtime_secrets(dest: FakeDestination) -> None:
    body = b'{"order": 1}'
    post(dest, "fast/sig", body, signed_headers("msg_a", body, SECRET))
    assert dest.name_stats("sig")["sig_unchecked"] == 1

    dest.set_secrets("sig", [SECRET])
    post(dest, "fast/sig", body, signed_headers("msg_b", body, SECRET))
    post(dest, "fast/sig", body + b" ", signed_headers("msg_c", body, SECRET))
    post(dest, "fast/sig", body, signed_headers("msg_d", body, OTHER_SECRET))
    post(dest, "fast/sig", body, {"webhook-id": "msg_e"})
    # During rotation two signatures are sent; one matching is enough.
    post(dest, "fast/sig", body, signed_headers("msg_f", body, OTHER_SECRET, SECRET))
    stats = dest.name_stats("sig")
    assert (stats["sig_ok"], stats["sig_bad"], stats["sig_unchecked"]) == (2, 3, 1)


def test_signatures_checked_against_cli_secrets() -> None:
    with FakeDestination(secrets=[OTHER_SECRET, SECRET]) as d:
        body = b"[1,2,3]"
        post(d, "fast/cli", body, signed_headers("msg_1", body, SECRET))
        post(d, "fast/cli", body, signed_headers("msg_2", b"[1,2]", SECRET))
        stats = d.name_stats("cli")
        assert (stats["sig_ok"], stats["sig_bad"]) == (1, 1)


def test_dead_never_answers(dest: FakeDestination) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        post(dest, "dead/gone", headers={"webhook-id": "msg_dead"}, timeout=1.0)
    assert time.monotonic() - started >= 1.0
    stats = dest.name_stats("gone")
    assert stats["requests"] == 1
    assert stats["responses"] == {}
    # Our client hung up; the server must see that and not count it as in flight.
    deadline = time.monotonic() + 5
    while dest.name_stats("gone")["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dest.name_stats("gone")["in_flight"] == 0


def test_429_carries_retry_after(dest: FakeDestination) -> None:
    resp = post(dest, "429/17/limited")
    assert resp.status == 429
    assert resp.getheader("retry-after") == "17"


def test_status_and_redirect_not_followed(dest: FakeDestination) -> None:
    assert post(dest, "status/410/gone410").status == 410
    resp = post(dest, "status/302/moved")
    assert resp.status == 302
    assert resp.getheader("location") == "/fast/moved"
    assert post(dest, "status/99/bad").status == 400
    assert post(dest, "nosuchkind/x").status == 404
    assert dest.name_stats("_unmatched")["requests"] >= 2


def test_down_until_recovers(dest: FakeDestination) -> None:
    far = int(time.time() * 1000) + 3_600_000
    assert post(dest, f"down-until/{far}/still-down").status == 503
    # Down for a moment: 503 until then, 200 from then on, whenever this machine gets there.
    until_ms = int(time.time() * 1000) + 300
    statuses = [post(dest, f"down-until/{until_ms}/recovering").status]
    while statuses[-1] != 200:
        assert len(statuses) < 1000, statuses
        time.sleep(0.05)
        statuses.append(post(dest, f"down-until/{until_ms}/recovering").status)
    assert time.time() * 1000 >= until_ms and set(statuses[:-1]) <= {503}, statuses


def test_toggle_control(dest: FakeDestination) -> None:
    assert post(dest, "toggle/tg").status == 200
    dest.control("tg", "fail")
    assert post(dest, "toggle/tg").status == 500
    dest.control("tg", "fail", status=503)
    assert post(dest, "toggle/tg").status == 503
    dest.control("tg", "hang")
    with pytest.raises(TimeoutError):
        post(dest, "toggle/tg", timeout=0.5)
    dest.control("tg", "ok")
    assert post(dest, "toggle/tg").status == 200
    assert dest.name_stats("tg")["responses"] == {"200": 2, "500": 1, "503": 1}


def test_stored_body_is_byte_exact(dest: FakeDestination) -> None:
    body = bytes(range(256)) + b'{"caf\xc3\xa9": "\xff"}'
    post(dest, "fast/exact", body, {"webhook-id": "msg_exact", "x-custom": "yes"})
    [kept] = dest.requests("exact")
    assert kept["body"] == body
    assert kept["headers"]["webhook-id"] == "msg_exact"
    assert kept["headers"]["x-custom"] == "yes"
    assert kept["method"] == "POST"
    assert kept["path"] == "/fast/exact"
    assert kept["status"] == 200


def test_keeps_only_last_requests() -> None:
    with FakeDestination(extra_args=["--keep", "3"]) as d:
        for i in range(5):
            post(d, "fast/ring", f"{i}".encode())
        assert [r["body"] for r in d.requests("ring")] == [b"2", b"3", b"4"]


def test_bigbody_size(dest: FakeDestination) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", dest.port, timeout=5)
    conn.request("POST", "/bigbody/100000/big", body=b"{}")
    assert len(conn.getresponse().read()) == 100_000
    conn.close()


def test_max_concurrent_with_parallel_hanging_requests(dest: FakeDestination) -> None:
    """20 requests held open at once (they never get an answer), counted as concurrent
    while they are, and no longer in flight once their clients hang up."""
    clients = [http.client.HTTPConnection("127.0.0.1", dest.port, timeout=30)
               for _ in range(20)]

    def hang(client: http.client.HTTPConnection) -> None:
        client.request("POST", "/dead/conc", body=b"{}")
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            client.getresponse()

    with ThreadPoolExecutor(max_workers=20) as pool:
        waiting = [pool.submit(hang, client) for client in clients]
        wait_until(lambda: dest.name_stats("conc").get("in_flight") == 20, 30,
                   "20 requests open")
        for client in clients:  # hang up: the blocked reads end
            assert client.sock is not None
            client.sock.shutdown(socket.SHUT_RDWR)
        for future in waiting:
            future.result()
    for client in clients:
        client.close()
    wait_until(lambda: dest.name_stats("conc")["in_flight"] == 0, 30, "hung up")
    assert dest.name_stats("conc")["max_concurrent"] == 20


def test_flaky_is_reproducible_with_seed() -> None:
    def run() -> list[int]:
        with FakeDestination(extra_args=["--seed", "42"]) as d:
            return [post(d, "flaky/50/f").status for _ in range(40)]

    first = run()
    assert first == run()
    assert 0 < first.count(500) < 40


def test_order_recorded_and_reset() -> None:
    with FakeDestination(extra_args=["--record-order"]) as d:
        for msg_id in ["msg_3", "msg_1", "msg_2", "msg_1"]:
            post(d, "fast/ord", headers={"webhook-id": msg_id})
        assert d.order("ord") == ["msg_3", "msg_1", "msg_2", "msg_1"]
        d.reset()
        assert d.stats()["names"] == {}
        assert d.order("ord") == []


def test_stats_file_written_on_sigterm(tmp_path: Path) -> None:
    stats_file = tmp_path / "stats.json"
    with FakeDestination(extra_args=["--stats-file", os.fspath(stats_file)]) as d:
        post(d, "fast/saved", headers={"webhook-id": "msg_s"})
    saved = json.loads(stats_file.read_text())
    assert saved["names"]["saved"]["delivered_ids"] == 1
    assert saved["uptime_ms"] >= 0


def test_random_latency_stays_within_its_range(dest: FakeDestination) -> None:
    started = time.monotonic()
    assert post(dest, "random/300/400/rnd").status == 200
    # Only the lower bound is certain on a loaded machine: never answered early.
    assert time.monotonic() - started >= 0.3
    assert dest.name_stats("rnd")["delivered_ids"] == 0  # no webhook-id sent
    assert dest.name_stats("rnd")["responses"] == {"200": 1}
    assert post(dest, "random/400/300/rnd").status == 400  # max below min: refused


def test_drip_sends_headers_first_and_the_body_over_time(dest: FakeDestination) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", dest.port, timeout=10)
    started = time.monotonic()
    conn.request("POST", "/drip/500/drip", body=b"{}", headers={"webhook-id": "msg_drip"})
    resp = conn.getresponse()
    assert resp.status == 200
    body = resp.read()
    assert time.monotonic() - started >= 0.45  # the body took the drip's time
    assert body.strip() == b"{}"
    conn.close()
    assert dest.name_stats("drip")["delivered_ids"] == 1


def test_stats_report_own_cpu(dest: FakeDestination) -> None:
    for _ in range(50):
        post(dest, "fast/cpu")
    stats = dest.stats()
    assert isinstance(stats["cpu_user_ms"], int) and isinstance(stats["cpu_system_ms"], int)
    assert stats["cpu_user_ms"] + stats["cpu_system_ms"] > 0

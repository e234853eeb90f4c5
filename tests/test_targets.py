import asyncio
import socket
from collections.abc import Callable, Iterator

import pytest

from engine.webhooks import targets
from engine.webhooks.targets import (
    TargetRefused,
    TargetUnresolvable,
    resolve_and_check,
    resolve_and_check_async,
    validate_url,
)

REFUSED = [
    # loopback, private, link-local, multicast, unspecified, reserved, CGNAT
    "http://127.0.0.1/",
    "http://127.8.9.10:8080/hook",
    "http://10.0.0.1/",
    "http://172.16.5.4/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://224.0.0.1/",
    "http://0.0.0.0/",
    "http://0/",
    "http://240.0.0.1/",
    "http://255.255.255.255/",
    "http://100.64.0.1/",
    "http://100.127.255.254/",
    "http://192.0.2.1/",
    "http://198.18.0.1/",
    # numeric forms libc and curl read as IPv4
    "http://2130706433/",
    "http://127.1/",
    "http://0x7f.1/",
    "http://0177.0.0.1/",
    "http://017700000001/",
    "http://0x7f000001/",
    "http://0xa9.0xfe.0xa9.0xfe/",
    "http://3232235777/",
    # IPv6 and IPv4 inside IPv6
    "http://[::1]/",
    "http://[::]/",
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://[ff02::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[::ffff:10.0.0.1]/",
    "http://[::127.0.0.1]/",
    "http://[2002:7f00:1::1]/",  # 6to4 of 127.0.0.1
    "http://[2002:a9fe:a9fe::1]/",  # 6to4 of 169.254.169.254
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",  # teredo, client 127.0.0.1
    "http://[64:ff9b::7f00:1]/",  # NAT64 of 127.0.0.1
    "http://[fe80::1%25eth0]/",
    # names
    "http://localhost/",
    "http://LOCALHOST:8080/",
    "http://localhost./",
    "http://api.localhost/",
    "http://a.b.localhost/x",
    "http://127.0.0.1./",
    # shape
    "ftp://example.com/",
    "file:///etc/passwd",
    "gopher://example.com/",
    "example.com/hook",
    "http:///nohost",
    "http://user:pass@example.com/",
    "http://user@example.com/",
    "http://:@example.com/",
    "http://example.com:0/",
    "http://example.com:65536/",
    "http://example.com:99999/",
    "http://example.com:port/",
    "http://exa mple.com/",
    "http://example.com/\tx",
    "http://example.com/\nx",
    "https://example.com/" + "a" * 2048,
]

ACCEPTED = {
    "https://example.com/hook": "https://example.com/hook",
    "http://93.184.216.34/x": "http://93.184.216.34/x",
    "HTTPS://Example.COM:443/Path?q=1#frag": "https://example.com/Path?q=1",
    "http://example.com": "http://example.com/",
    "http://example.com:8080/a": "http://example.com:8080/a",
    "https://example.com:65535/": "https://example.com:65535/",
    "http://[2606:4700:4700::1111]/dns": "http://[2606:4700:4700::1111]/dns",
    "http://1.1.1.1:80/": "http://1.1.1.1/",
    # public address in a legacy numeric form: accepted, written canonically
    "http://16843009/": "http://1.1.1.1/",
    "https://bücher.example/": "https://xn--bcher-kva.example/",
    "https://localhost.example.com/": "https://localhost.example.com/",
    "https://hooks.example.com/" + "a" * 1900: "https://hooks.example.com/" + "a" * 1900,
}


@pytest.mark.parametrize("url", REFUSED)
def test_refused(url: str) -> None:
    with pytest.raises(TargetRefused):
        validate_url(url, allow_private=False)


@pytest.mark.parametrize(("url", "normalised"), ACCEPTED.items())
def test_accepted(url: str, normalised: str) -> None:
    assert validate_url(url, allow_private=False) == normalised


@pytest.mark.parametrize(
    ("url", "normalised"),
    [
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/"),
        ("http://localhost:9000/hook", "http://localhost:9000/hook"),
        ("http://[::1]:9000/", "http://[::1]:9000/"),
        ("http://127.1:8080/", "http://127.0.0.1:8080/"),
    ],
)
def test_allow_private_accepts_loopback(url: str, normalised: str) -> None:
    assert validate_url(url, allow_private=True) == normalised


@pytest.mark.parametrize(
    "url",
    ["ftp://127.0.0.1/", "http://u:p@127.0.0.1/", "http://127.0.0.1:0/", "http:///x"],
)
def test_allow_private_still_checks_shape(url: str) -> None:
    with pytest.raises(TargetRefused):
        validate_url(url, allow_private=True)


def test_refusal_messages_name_the_problem() -> None:
    with pytest.raises(TargetRefused, match="credentials"):
        validate_url("https://u:p@example.com/", allow_private=False)
    with pytest.raises(TargetRefused, match="scheme"):
        validate_url("ftp://example.com/", allow_private=False)
    with pytest.raises(TargetRefused, match=r"127\.0\.0\.1"):
        validate_url("http://2130706433/", allow_private=False)


def fake_getaddrinfo(
    answers: dict[str, list[str]], calls: list[str] | None = None
) -> Callable[..., list[tuple]]:
    def getaddrinfo(host: str, port: int, *args: object, **kwargs: object) -> list[tuple]:
        if calls is not None:
            calls.append(host)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        out = []
        for addr in answers[host]:
            if ":" in addr:
                out.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (addr, port, 0, 0)))
            else:
                out.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (addr, port)))
        return out

    return getaddrinfo


ANSWERS = {
    "public.test": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
    "rebind.test": ["127.0.0.1"],
    "mixed.test": ["93.184.216.34", "10.0.0.7"],
    "mapped.test": ["::ffff:169.254.169.254"],
}


@pytest.fixture(autouse=True)
def fresh_lookup_cache() -> Iterator[None]:
    targets._lookups.clear()
    yield
    targets._lookups.clear()


def test_resolve_public_returns_first_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo(ANSWERS))
    assert resolve_and_check("public.test", 443, allow_private=False) == "93.184.216.34"


@pytest.mark.parametrize("host", ["rebind.test", "mixed.test", "mapped.test"])
def test_resolve_refuses_any_private_answer(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo(ANSWERS))
    with pytest.raises(TargetRefused):
        resolve_and_check(host, 80, allow_private=False)
    assert resolve_and_check(host, 80, allow_private=True) == ANSWERS[host][0]


def test_resolve_unresolvable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo(ANSWERS))
    with pytest.raises(TargetUnresolvable):
        resolve_and_check("nxdomain.test", 80, allow_private=False)


def test_resolve_real_localhost() -> None:
    # /etc/hosts only: no DNS traffic leaves the machine.
    with pytest.raises(TargetRefused):
        resolve_and_check("localhost", 80, allow_private=False)
    assert resolve_and_check("localhost", 80, allow_private=True) in ("127.0.0.1", "::1")


@pytest.mark.parametrize("host", ["2130706433", "127.1", "0x7f.1", "::1", "::ffff:127.0.0.1"])
def test_resolve_refuses_numeric_loopback(host: str) -> None:
    with pytest.raises(TargetRefused):
        resolve_and_check(host, 80, allow_private=False)


def test_async_resolve_caches_and_shares_lookups(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo(ANSWERS, calls))

    async def main() -> None:
        pins = await asyncio.gather(
            *(resolve_and_check_async("public.test", 443, allow_private=False) for _ in range(50))
        )
        assert set(pins) == {"93.184.216.34"}
        assert calls == ["public.test"]
        with pytest.raises(TargetRefused):
            await resolve_and_check_async("mixed.test", 443, allow_private=False)
        for _ in range(3):
            with pytest.raises(TargetUnresolvable):
                await resolve_and_check_async("nxdomain.test", 443, allow_private=False)
        # policy is applied on every call, the cached answer is the raw lookup
        assert await resolve_and_check_async("mixed.test", 443, allow_private=True) == (
            "93.184.216.34"
        )
        assert calls == ["public.test", "mixed.test", "nxdomain.test"]

    asyncio.run(main())


def test_async_resolve_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo(ANSWERS, calls))
    clock = [1000.0]
    monkeypatch.setattr(targets.time, "monotonic", lambda: clock[0])

    async def main() -> None:
        await resolve_and_check_async("public.test", 443, allow_private=False)
        clock[0] += targets.RESOLVE_TTL_S - 1
        await resolve_and_check_async("public.test", 443, allow_private=False)
        assert len(calls) == 1
        clock[0] += 2
        await resolve_and_check_async("public.test", 443, allow_private=False)
        assert len(calls) == 2

    asyncio.run(main())


def test_async_resolve_across_event_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo(ANSWERS))
    for _ in range(2):
        assert (
            asyncio.run(resolve_and_check_async("public.test", 443, allow_private=False))
            == "93.184.216.34"
        )

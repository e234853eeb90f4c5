"""Destination URL policy: which targets the engine may POST to (SSRF protection).

A URL is checked twice: `validate_url` when a destination is created or changed,
and `resolve_and_check*` right before connecting. The connect-time check returns
the one address the HTTP client must pin (CURLOPT_RESOLVE), so a DNS answer that
changes between the check and the connect (rebinding) cannot reach a refused host.

The connect-time lookup is the system resolver's (`system_lookup`) unless a caller passes
another `Lookup`: a test's stand-in that knows names the system does not, so that a request
reaches its server only through the pinned address.
"""

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

MAX_URL_LENGTH = 2048
ALLOWED_SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443}
RESOLVE_TTL_S = 30.0
# A failed lookup is remembered briefly so a batch to one dead name costs one lookup.
RESOLVE_FAILURE_TTL_S = 5.0
RESOLVE_CACHE_MAX = 10_000

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# What may be reached besides public addresses: True for every private target
# (--allow-private-targets), or the networks --allow-targets lists (False or (): none).
# Every check below takes one as its `allow_private`.
Allowance = bool | tuple[IPNetwork, ...]

CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")


class TargetError(ValueError):
    """A destination cannot be delivered to; the message is fit for an API error."""


class TargetRefused(TargetError):
    """The URL or the address it resolves to is not allowed by policy."""


class TargetUnresolvable(TargetError):
    """The destination host name did not resolve."""


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses a packet to this IPv6 address may end up at."""
    embedded = []
    if ip.ipv4_mapped is not None:
        embedded.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        embedded.append(ip.sixtofour)
    if ip.teredo is not None:
        embedded.extend(ip.teredo)
    # IPv4-compatible (::a.b.c.d, deprecated) and NAT64 keep the IPv4 in the low 32 bits.
    if int(ip) >> 32 == 0 or ip in NAT64_WELL_KNOWN:
        embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return embedded


def is_public_address(ip: IPAddress) -> bool:
    """True when `ip` is a globally routable unicast address, also through IPv6 embeddings."""
    if (
        not ip.is_global
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
    ):
        return False
    if isinstance(ip, ipaddress.IPv4Address):
        return ip not in CGNAT
    return all(is_public_address(v4) for v4 in _embedded_ipv4(ip))


def parse_allowed_networks(text: str) -> tuple[IPNetwork, ...]:
    """`--allow-targets 10.0.0.0/8,fd00::/8` -> networks; ValueError naming a bad one."""
    networks = []
    for part in text.split(","):
        cidr = part.strip()
        if not cidr:
            continue
        try:
            networks.append(ipaddress.ip_network(cidr, strict=True))
        except ValueError as exc:
            raise ValueError(f"allow_targets: {cidr!r} is not a network in CIDR form: {exc}"
                             ) from None
    if not networks:
        raise ValueError("allow_targets: list at least one network, e.g. 10.0.0.0/8")
    return tuple(networks)


def _permitted(ip: IPAddress, allow_private: Allowance) -> bool:
    """Public, or inside one of the allowed networks. Only the address as written counts:
    an IPv4-mapped or other embedding of an allowed IPv4 address is still refused, so the
    allow-list means exactly the ranges it names."""
    if is_public_address(ip):
        return True
    if isinstance(allow_private, tuple):
        return any(ip.version == net.version and ip in net for net in allow_private)
    return False


def parse_ip_host(host: str) -> IPAddress | None:
    """The address a host string denotes numerically, as curl and libc read it, else None.

    `inet_aton` accepts the legacy forms (`127.1`, `0x7f.1`, `0177.0.0.1`,
    `2130706433`) that name loopback without looking like it.
    """
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _is_localhost_name(host: str) -> bool:
    return host == "localhost" or host.endswith(".localhost")


def check_host(host: str, allow_private: Allowance) -> IPAddress | None:
    """Apply the creation-time policy to a lower-cased host; returns its IP if numeric."""
    bare = host.removesuffix(".")
    ip = parse_ip_host(bare)
    if allow_private is True:
        return ip
    # A name is checked by what it resolves to (at connect time); `localhost` is refused
    # outright unless every private target is allowed, whatever the allow-list.
    if _is_localhost_name(bare):
        raise TargetRefused(f"url host {host!r} is a loopback name")
    if ip is not None and not _permitted(ip, allow_private):
        raise TargetRefused(f"url host {host!r} is a private or reserved address ({ip})")
    return ip


def validate_url(url: str, allow_private: Allowance) -> str:
    """The normalised destination URL, or TargetRefused saying what is wrong with it."""
    if len(url) > MAX_URL_LENGTH:
        raise TargetRefused(f"url is longer than {MAX_URL_LENGTH} characters")
    # urlsplit silently drops tabs and newlines; curl would not, so refuse them outright.
    if any(ch <= " " or ch == "\x7f" for ch in url):
        raise TargetRefused("url contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRefused(f"url is malformed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise TargetRefused("url scheme must be http or https")
    if "@" in parts.netloc:
        raise TargetRefused("url must not contain credentials")
    host = parts.hostname
    if not host:
        raise TargetRefused("url has no host")
    if port == 0:
        raise TargetRefused("url port must be between 1 and 65535")
    if "%" in host:
        raise TargetRefused("url host must not carry an IPv6 zone")
    try:
        host = host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise TargetRefused("url host is not a valid domain name") from None

    ip = check_host(host, allow_private)
    if isinstance(ip, ipaddress.IPv6Address):
        netloc = f"[{ip.compressed}]"
    elif ip is not None:
        netloc = str(ip)  # canonical dotted quad, whatever numeric form was given
    else:
        netloc = host
    if port is not None and port != DEFAULT_PORTS[scheme]:
        netloc += f":{port}"
    path = parts.path or "/"
    query = f"?{parts.query}" if parts.query else ""
    return f"{scheme}://{netloc}{path}{query}"


def _check_resolved(host: str, addresses: list[str], allow_private: Allowance) -> str:
    """The address to pin; every resolved address must pass, so mixed answers are refused."""
    if allow_private is not True:
        for address in addresses:
            if not _permitted(ipaddress.ip_address(address.partition("%")[0]), allow_private):
                raise TargetRefused(f"host {host!r} resolves to a refused address ({address})")
    return addresses[0]


def _addresses(infos: list[tuple]) -> list[str]:
    return [str(sockaddr[0]) for *_, sockaddr in infos]


def resolve_and_check(host: str, port: int, allow_private: Allowance) -> str:
    """Resolve `host` (blocking) and return the one address to pin for this connection."""
    check_host(host.lower(), allow_private)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise TargetUnresolvable(f"host {host!r} does not resolve: {exc}") from None
    return _check_resolved(host, _addresses(infos), allow_private)


# (host, port) -> the host's addresses, in the order to try them; TargetUnresolvable when
# it has none.
Lookup = Callable[[str, int], Awaitable[list[str]]]


async def system_lookup(host: str, port: int) -> list[str]:
    """The system resolver (getaddrinfo) on the running loop."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise TargetUnresolvable(f"host {host!r} does not resolve: {exc}") from None
    return _addresses(infos)


# (host, port, lookup) -> (expires_at, lookup task). Caching the task, not its answer,
# makes concurrent deliveries to one host share a single getaddrinfo call.
_LookupKey = tuple[str, int, Lookup]
_lookups: dict[_LookupKey, tuple[float, asyncio.Task[list[str]]]] = {}


def _expire_failed_lookup(key: _LookupKey, task: asyncio.Task[list[str]]) -> None:
    entry = _lookups.get(key)
    if entry is None or entry[1] is not task:
        return
    if task.cancelled():
        del _lookups[key]
    elif task.exception() is not None:
        _lookups[key] = (time.monotonic() + RESOLVE_FAILURE_TTL_S, task)


def _lookup(host: str, port: int, lookup: Lookup) -> asyncio.Task[list[str]]:
    key = (host, port, lookup)
    now = time.monotonic()
    loop = asyncio.get_running_loop()
    entry = _lookups.get(key)
    # A task from another (finished) event loop cannot be awaited here.
    if entry is not None and entry[0] > now and entry[1].get_loop() is loop:
        return entry[1]
    if len(_lookups) >= RESOLVE_CACHE_MAX:
        for stale in [k for k, (expires, _) in _lookups.items() if expires <= now]:
            del _lookups[stale]
        if len(_lookups) >= RESOLVE_CACHE_MAX:
            _lookups.clear()
    task = loop.create_task(lookup(host, port))
    task.add_done_callback(lambda done: _expire_failed_lookup(key, done))
    _lookups[key] = (now + RESOLVE_TTL_S, task)
    return task


# (host, port, lookup) -> (the lookup task it was checked from, allow_private, the address
# to pin)
_checked_pins: dict[_LookupKey, tuple[asyncio.Task[list[str]], Allowance, str]] = {}


def cached_pin(
    host: str, port: int, allow_private: Allowance, lookup: Lookup = system_lookup
) -> str | None:
    """The address to pin from a fresh, finished lookup on this loop, without waiting (the
    worker's path for every request but a host's first in a while); None when there is no
    such lookup yet. Raises TargetRefused like `resolve_and_check_async`."""
    key = (host, port, lookup)
    entry = _lookups.get(key)
    if entry is None or entry[0] <= time.monotonic():
        return None
    task = entry[1]
    if not task.done() or task.cancelled() or task.exception() is not None:
        return None
    if task.get_loop() is not asyncio.get_running_loop():
        return None
    checked = _checked_pins.get(key)
    if checked is not None and checked[0] is task and checked[1] == allow_private:
        return checked[2]
    check_host(host.lower(), allow_private)
    pin = _check_resolved(host, task.result(), allow_private)
    if len(_checked_pins) >= RESOLVE_CACHE_MAX:
        _checked_pins.clear()
    _checked_pins[key] = (task, allow_private, pin)
    return pin


async def resolve_and_check_async(
    host: str, port: int, allow_private: Allowance, lookup: Lookup = system_lookup
) -> str:
    """`resolve_and_check` on the running loop, with answers cached for RESOLVE_TTL_S."""
    check_host(host.lower(), allow_private)
    # shield: one caller's cancellation must not cancel the lookup others share.
    addresses = await asyncio.shield(_lookup(host, port, lookup))
    return _check_resolved(host, addresses, allow_private)

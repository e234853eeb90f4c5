"""HTTP POSTs for deliveries: one pycurl multi handle driven by an asyncio event loop.

libcurl tells us which sockets to watch (M_SOCKETFUNCTION) and when its next
timeout is due (M_TIMERFUNCTION); readiness goes back to it through `socket_action`. No
thread per request, no polling: an idle pool costs nothing, and one process keeps
hundreds of requests in flight.

The event loop watches one descriptor per pool, an epoll instance the pool opens with its
multi handle and closes after removing its reader. libcurl's sockets are registered in
that epoll only, as libcurl asks (CURL_POLL_IN/OUT/INOUT), and libcurl opens and closes
them itself: no close-socket callback. A socket closed while registered leaves the epoll
by itself (the kernel drops a closed file from every epoll), so nothing the loop watches
is ever a closed or reused descriptor: that is what aborted workers (issue 37,
docs/decisions/0020-the-loop-watches-one-epoll-per-pool.md).

That also makes an idle kept-alive connection's registration safe to keep: libcurl drops
a connection's watch (CURL_POLL_REMOVE) after every response and asks for it again with
the next request on it, and deleting and re-adding it costs two epoll_ctl calls, several
times what one modification costs (measured in the decision record). So at
CURL_POLL_REMOVE a socket watched for reading stays registered, as idle; it is dropped
when it fires (the peer closed or sent something unasked: libcurl sees that when it next
uses the connection) or, when libcurl closes it, by the kernel.

One request's handle and result: engine/worker/http/transfer.py. Response bodies: the first
`max_body` bytes are kept and the rest is read and discarded, because aborting a
transfer makes libcurl close the connection, and keep-alive is worth far more than the
bytes saved. A body larger than `max_drain` is aborted anyway (the status line is known
by then, so the attempt still counts as answered): an endless body must not hold a slot
until timeout.
"""

import asyncio
import contextlib
import select
import time
from functools import lru_cache, partial
from urllib.parse import urlsplit

import pycurl

from engine.observe.oplog import log_event
from engine.webhooks.egress import EgressOptions
from engine.webhooks.targets import (
    Allowance,
    Lookup,
    TargetRefused,
    TargetUnresolvable,
    cached_pin,
    check_host,
    resolve_and_check_async,
    system_lookup,
)
from engine.worker.http.curl_faults import FaultLog
from engine.worker.http.transfer import (
    HttpResult,
    OnDone,
    Transfer,
    failed_result,
)

DEFAULT_MAX_BODY = 4096
DEFAULT_MAX_DRAIN = 1 << 20
MAX_CONNECT_TIMEOUT_MS = 5000
# Ready sockets taken from the pool's epoll per wake-up of the loop; more stay ready
# (level-triggered) and are taken at the next one.
MAX_EVENTS = 1024

# What libcurl asks to watch -> epoll's flags. Errors and hang-ups are reported by epoll
# whatever was asked.
_EPOLL_FLAGS = {
    pycurl.POLL_IN: select.EPOLLIN,
    pycurl.POLL_OUT: select.EPOLLOUT,
    pycurl.POLL_INOUT: select.EPOLLIN | select.EPOLLOUT,
}
# epoll's report -> socket_action's bits, as libcurl's own poll loop reads poll(2): an
# error or hang-up is readable (the read reports it: a reset is a `recv` error) and
# writable (a refused connect shows in SO_ERROR).
_IN_FLAGS = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP
_OUT_FLAGS = select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP

@lru_cache(maxsize=4096)
def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))


def _target_error(exc: TargetRefused | TargetUnresolvable) -> str:
    return "dns" if isinstance(exc, TargetUnresolvable) else "refused_target"


def _ready_pin(url: str, allow_private: Allowance, lookup: Lookup) -> tuple[bool, str | None]:
    """(known, pin) for the connect-time check, without waiting: known for an IP literal
    (no DNS, so nothing to pin: it is checked as is) and for a host whose checked address
    is cached. Raises TargetRefused for a refused target."""
    host, port = host_port(url)
    if check_host(host, allow_private) is not None:
        return True, None
    pin = cached_pin(host, port, allow_private, lookup)
    return pin is not None, pin


def _untrusted_proxy(egress: EgressOptions | None) -> str | None:
    """A destination's own proxy, which the target policy checks as it does the
    destination; None for no proxy or the operator's --egress-proxy."""
    if egress is None or egress.proxy is None or egress.proxy_trusted:
        return None
    return egress.proxy


def _ready_pins(url: str, egress: EgressOptions | None, allow_private: Allowance,
                lookup: Lookup) -> tuple[bool, str | None, str | None]:
    """(known, pin, proxy pin): `_ready_pin` for the destination and for its own proxy."""
    known, pin = _ready_pin(url, allow_private, lookup)
    proxy = _untrusted_proxy(egress)
    if proxy is None:
        return known, pin, None
    proxy_known, proxy_pin = _ready_pin(proxy, allow_private, lookup)
    return known and proxy_known, pin, proxy_pin


def _address(pin: str) -> str:
    return f"[{pin}]" if ":" in pin else pin


def _resolve_entry(url: str, pin: str) -> list[str]:
    """The CURLOPT_RESOLVE list that makes curl connect to `pin` for this URL's host."""
    host, port = host_port(url)
    return [f"{host}:{port}:{_address(pin)}"]


def _connect_to_entry(url: str, pin: str) -> list[str]:
    """The CURLOPT_CONNECT_TO list that makes a tunnel's CONNECT name `pin` for this URL's
    host: the proxy is asked for the checked address, never for the name."""
    host, port = host_port(url)
    return [f"{host}:{port}:{_address(pin)}:{port}"]


class CurlPool:
    """Concurrent HTTP/1.1 POSTs over one CurlMulti, driven by the running event loop.

    Create it inside the loop that will use it. Easy handles are recycled so that
    the multi handle's connection cache keeps connections alive across requests.
    `lookup` resolves destination names for the connect-time check (engine/webhooks/targets.py).
    """

    def __init__(
        self,
        max_connects: int = 512,
        max_host_connections: int = 0,
        max_body: int = DEFAULT_MAX_BODY,
        max_drain: int = DEFAULT_MAX_DRAIN,
        lookup: Lookup = system_lookup,
        ca_bundle: bytes | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._ca_bundle = ca_bundle  # --ca-bundle's certificates, trusted for all
        self._lookup = lookup
        self._max_body = max_body
        self._max_drain = max_drain
        self._max_connects = max_connects
        self._max_host_connections = max_host_connections
        self.faults = FaultLog()
        self.rebuilds = 0  # times the multi handle was found unusable and replaced
        self._free: list[Transfer] = []
        self._active: dict[pycurl.Curl, Transfer] = {}
        self._watched: dict[int, int] = {}  # fd -> epoll flags registered in self._epoll
        self._idle: set[int] = set()  # of those, sockets libcurl stopped watching (IN)
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._timer_due = 0.0
        self._closed = False
        self._checking: set[asyncio.Task[HttpResult]] = set()  # first lookups of a host
        self._multi, self._epoll = self._new_multi()

    def _new_multi(self) -> tuple[pycurl.CurlMulti, select.epoll]:
        """A multi handle and the epoll its sockets are watched in, the epoll watched by
        the loop (see the module's docstring)."""
        multi = pycurl.CurlMulti()
        multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        multi.setopt(pycurl.M_MAXCONNECTS, self._max_connects)
        multi.setopt(pycurl.M_MAX_HOST_CONNECTIONS, self._max_host_connections)
        epoll = select.epoll()
        self._loop.add_reader(epoll.fileno(), self._on_ready, epoll)
        return multi, epoll

    def _drop_multi(self) -> pycurl.CurlMulti:
        """Stop watching the multi handle's sockets: the loop's reader first, then the
        epoll it reads. Returns the multi handle, for the caller to close."""
        self._cancel_timer()
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
        self._watched.clear()
        self._idle.clear()
        return self._multi

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def start(
        self,
        url: str,
        headers: list[str],
        body: bytes,
        timeout_ms: int,
        on_done: OnDone,
        pin: str | None = None,
        egress: EgressOptions | None = None,
    ) -> None:
        """Begin a POST; `on_done` gets its result from the event loop (see OnDone)."""
        self._begin(url, headers, body, timeout_ms, pin, on_done, egress)

    async def post(
        self,
        url: str,
        headers: list[str],
        body: bytes,
        timeout_ms: int,
        pin: str | None = None,
        egress: EgressOptions | None = None,
        proxy_pin: str | None = None,
    ) -> HttpResult:
        """POST `body` to `url`; with `pin`, connect to that address whatever DNS says
        (through `egress`'s proxy: have the proxy connect to it); with `proxy_pin`, to
        that address of the proxy."""
        future: asyncio.Future[HttpResult] = self._loop.create_future()

        def settle(result: HttpResult | None) -> None:
            if future.done():
                return
            if result is None:
                future.cancel()
            else:
                future.set_result(result)

        transfer = self._begin(url, headers, body, timeout_ms, pin, settle, egress, proxy_pin)
        try:
            return await future
        except asyncio.CancelledError:
            if self._active.get(transfer.curl) is transfer:
                self._release(transfer)
            raise

    def _begin(
        self, url: str, headers: list[str], body: bytes, timeout_ms: int, pin: str | None,
        on_done: OnDone, egress: EgressOptions | None = None, proxy_pin: str | None = None,
    ) -> Transfer:
        if self._closed:
            raise RuntimeError("CurlPool is closed")
        transfer = (self._free.pop() if self._free
                    else Transfer(self._max_body, self._max_drain, self._ca_bundle))
        curl = transfer.curl
        if transfer.egress is not egress:
            transfer.use_egress(egress)
        curl.setopt(pycurl.HTTPHEADER, headers)
        curl.setopt(pycurl.POSTFIELDSIZE, len(body))
        curl.setopt(pycurl.POSTFIELDS, body)
        # A handle keeps its options: what the previous request on it already set (the
        # same destination, most of the time) is not set again.
        if (url, timeout_ms, pin, proxy_pin) != transfer.target:
            transfer.target = (url, timeout_ms, pin, proxy_pin)
            curl.setopt(pycurl.URL, url)
            curl.setopt(pycurl.TIMEOUT_MS, timeout_ms)
            curl.setopt(pycurl.CONNECTTIMEOUT_MS, min(timeout_ms, MAX_CONNECT_TIMEOUT_MS))
            if egress is not None and egress.proxy is not None:
                curl.setopt(pycurl.CONNECT_TO, [] if pin is None else _connect_to_entry(url, pin))
                curl.setopt(pycurl.RESOLVE, [] if proxy_pin is None
                            else _resolve_entry(egress.proxy, proxy_pin))
            else:
                # Entries land in the multi's shared DNS cache; a later unpinned request to
                # the same host:port may use them too, which only ever points at a checked
                # address.
                curl.setopt(pycurl.RESOLVE, [] if pin is None else _resolve_entry(url, pin))
        transfer.start(on_done)
        refused = self._add(curl, transfer)
        if refused is not None:
            # The multi is dead (see engine/worker/http/curl_faults.py): replace it, then try once
            # more on the new one. This request fails as an attempt only if that fails too.
            self._rebuild(refused)
            refused = self._add(curl, transfer)
        if refused is not None:
            transfer.on_done = None
            self._loop.call_soon(
                on_done, failed_result(f"internal: {refused}", transfer.started_at))
        return transfer

    def _add(self, curl: pycurl.Curl, transfer: Transfer) -> pycurl.error | None:
        """Hand the transfer to the multi; the multi's error if it refused it."""
        self._active[curl] = transfer
        try:
            self._multi.add_handle(curl)
        except pycurl.error as exc:
            del self._active[curl]
            return exc
        return None

    async def post_checked(
        self, url: str, headers: list[str], body: bytes, timeout_ms: int,
        allow_private: Allowance, egress: EgressOptions | None = None,
    ) -> HttpResult:
        """`post` after the connect-time target check; a refused or unresolvable
        target becomes a failed result (`refused_target` / `dns`), not an exception.
        Through a proxy too: the destination is checked here, before the proxy is asked
        for anything, and a destination's own proxy is checked as well (`proxy` when
        that fails)."""
        if allow_private is True:
            return await self.post(url, headers, body, timeout_ms, egress=egress)
        started_at = time.time()
        try:
            known, pin, proxy_pin = _ready_pins(url, egress, allow_private, self._lookup)
            if not known:
                pin = await resolve_and_check_async(*host_port(url), allow_private,
                                                    self._lookup)
        except (TargetRefused, TargetUnresolvable) as exc:
            return failed_result(_target_error(exc), started_at)
        proxy = _untrusted_proxy(egress)
        if not known and proxy is not None:
            try:
                proxy_pin = await resolve_and_check_async(*host_port(proxy), allow_private,
                                                          self._lookup)
            except (TargetRefused, TargetUnresolvable):
                return failed_result("proxy", started_at)
        return await self.post(url, headers, body, timeout_ms, pin, egress, proxy_pin)

    def start_checked(
        self, url: str, headers: list[str], body: bytes, timeout_ms: int,
        allow_private: Allowance, on_done: OnDone, egress: EgressOptions | None = None,
    ) -> None:
        """`start` after the connect-time target check. A host whose checked address is
        cached (the usual case) starts at once; only the first request to a host in a
        while waits for its lookup, as a task. A refused target reaches `on_done` as a
        failed result, from the loop like every other result."""
        if allow_private is True:
            self._begin(url, headers, body, timeout_ms, None, on_done, egress)
            return
        try:
            known, pin, proxy_pin = _ready_pins(url, egress, allow_private, self._lookup)
        except (TargetRefused, TargetUnresolvable) as exc:
            self._loop.call_soon(on_done, failed_result(_target_error(exc), time.time()))
            return
        if known:
            self._begin(url, headers, body, timeout_ms, pin, on_done, egress, proxy_pin)
            return
        task = self._loop.create_task(
            self.post_checked(url, headers, body, timeout_ms, allow_private, egress))
        self._checking.add(task)
        task.add_done_callback(partial(self._checked, on_done))

    def _checked(self, on_done: OnDone, task: asyncio.Task[HttpResult]) -> None:
        self._checking.discard(task)
        if task.cancelled():
            on_done(None)
        elif (exc := task.exception()) is not None:
            on_done(failed_result(f"internal: {exc!r}", time.time()))
        else:
            on_done(task.result())

    async def close(self) -> None:
        """Cancel what is in flight and free every handle and socket watch."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._checking):
            task.cancel()
        if self._checking:
            await asyncio.gather(*self._checking, return_exceptions=True)
        for transfer in list(self._active.values()):
            on_done = transfer.on_done
            self._release(transfer)
            if on_done is not None:
                on_done(None)
        self._drop_multi().close()  # closes its cached connections
        for transfer in self._free:
            transfer.curl.close()
        self._free.clear()

    def _release(self, transfer: Transfer) -> None:
        curl = transfer.curl
        del self._active[curl]
        self._multi.remove_handle(curl)
        transfer.on_done = None
        self._free.append(transfer)  # closed by `close`, after the multi

    def _rebuild(self, exc: BaseException) -> None:
        """Replace an unusable multi handle. Its transfers end as failed attempts (from
        the loop, never from inside a caller): each was claimed once and is answered
        once, so nothing is lost and no claim is doubled; a request that did reach its
        destination may be retried, as with any failed attempt."""
        self.faults.note("multi_unusable", exc)
        self.rebuilds += 1
        old, transfers = self._multi, list(self._active.values())
        log_event("http_client_rebuilt", error=str(exc)[:300], failed_transfers=len(transfers),
                  rebuilds=self.rebuilds)
        self._active.clear()
        self._drop_multi()
        self._multi, self._epoll = self._new_multi()
        for transfer in transfers:
            with contextlib.suppress(pycurl.error):
                old.remove_handle(transfer.curl)
        old.close()
        for transfer in transfers:  # not recycled: their state belonged to the dead multi
            on_done = transfer.on_done
            transfer.on_done = None
            transfer.curl.close()
            if on_done is not None:
                self._loop.call_soon(on_done, failed_result(
                    f"internal: http client rebuilt after {exc}", transfer.started_at))

    # libcurl callbacks. They must not raise (see engine/worker/http/curl_faults.py) and must
    # not call back into the multi.

    def _on_socket(self, what: int, fd: int, multi: pycurl.CurlMulti, socketp: object) -> None:
        try:
            self._watch(what, fd)
        except Exception as exc:
            self.faults.note("socket_callback", exc)
            # curl must learn that this socket is not watched: an error event on it, from
            # the loop, fails the transfer using it instead of leaving it to its timeout.
            self._loop.call_soon(self._act, fd, pycurl.CSELECT_ERR)

    def _watch(self, what: int, fd: int) -> None:
        """Register `fd` in the pool's epoll as libcurl asks. At POLL_REMOVE, which
        libcurl sends before it closes a socket it had us watch, a socket watched for
        reading stays registered as idle (see the module's docstring)."""
        epoll = self._epoll
        registered = self._watched.get(fd)
        if what == pycurl.POLL_REMOVE:
            if registered == select.EPOLLIN:
                self._idle.add(fd)
            elif registered is not None:
                del self._watched[fd]
                try:
                    epoll.unregister(fd)
                except OSError as exc:  # closed before its POLL_REMOVE: already dropped
                    self.faults.note("closed_while_watched", exc)
            return
        flags = _EPOLL_FLAGS[what]
        self._watched[fd] = flags
        idle = fd in self._idle
        self._idle.discard(fd)
        if registered is None:
            try:
                epoll.register(fd, flags)
            except FileExistsError as exc:  # registered under this number, unknown to us
                self.faults.note("closed_while_watched", exc)
                epoll.modify(fd, flags)
            return
        # Modified even when the flags are the same: an idle socket may have been closed
        # by libcurl since, and this be a new socket under its number.
        try:
            epoll.modify(fd, flags)
        except FileNotFoundError as exc:
            # The socket registered under this number was closed (the kernel dropped it)
            # and the number reused: routine for an idle one, out of step with libcurl
            # for one it was watching.
            if not idle:
                self.faults.note("closed_while_watched", exc)
            epoll.register(fd, flags)

    def _on_timer(self, timeout_ms: int) -> None:
        try:
            self._set_timer(timeout_ms)
        except Exception as exc:
            self.faults.note("timer_callback", exc)
            self._timer = None
            self._loop.call_soon(self._on_timeout)  # curl still gets its timeouts run

    def _set_timer(self, timeout_ms: int) -> None:
        if timeout_ms < 0:
            self._cancel_timer()
            return
        due = self._loop.time() + timeout_ms / 1000.0
        # curl moves its deadline at nearly every request start and finish. Keeping an
        # earlier wake-up instead of rescheduling is cheap: _on_timeout asks curl for
        # the real deadline when it fires early.
        if self._timer is not None and self._timer_due <= due:
            return
        self._cancel_timer()
        self._timer_due = due
        if timeout_ms == 0:
            self._timer = self._loop.call_soon(self._on_timeout)
        else:
            self._timer = self._loop.call_at(due, self._on_timeout)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # Event loop callbacks: hand readiness to libcurl, then collect finished transfers.

    def _on_ready(self, epoll: select.epoll) -> None:
        """The pool's epoll is readable: hand each ready socket to libcurl."""
        if epoll is not self._epoll:
            return  # a wake-up for an epoll rebuilt away by an earlier callback
        for fd, flags in epoll.poll(0, MAX_EVENTS):
            if fd in self._idle:
                # An idle connection: libcurl sees whatever this is when it next uses it.
                self._idle.discard(fd)
                del self._watched[fd]
                with contextlib.suppress(OSError):  # closed by an earlier _act: dropped
                    epoll.unregister(fd)
                continue
            events = (pycurl.CSELECT_IN if flags & _IN_FLAGS else 0) | (
                pycurl.CSELECT_OUT if flags & _OUT_FLAGS else 0)
            self._act(fd, events)
            if epoll is not self._epoll:
                return  # _act rebuilt the multi handle: these events were the old one's

    def _on_timeout(self) -> None:
        self._timer = None
        self._act(pycurl.SOCKET_TIMEOUT, 0)
        if self._timer is None and not self._closed:
            try:
                next_ms = self._multi.timeout()
            except pycurl.error as exc:
                self._rebuild(exc)
                return
            if next_ms >= 0:
                self._on_timer(next_ms)

    def _act(self, fd: int, events: int) -> None:
        if self._closed:
            return
        try:
            _, running = self._multi.socket_action(fd, events)
            if running < len(self._active):
                self._collect()
        except pycurl.error as exc:
            self._rebuild(exc)

    def _collect(self) -> None:
        while True:
            queued, succeeded, failed = self._multi.info_read()
            for curl in succeeded:
                self._finish(curl, 0, "")
            for curl, code, message in failed:
                self._finish(curl, code, message)
            if not queued:
                return

    def _finish(self, curl: pycurl.Curl, code: int, message: str) -> None:
        transfer = self._active.get(curl)
        if transfer is None:
            return
        on_done = transfer.on_done
        result = transfer.result(code, message)
        self._release(transfer)
        if on_done is not None:
            try:
                on_done(result)
            except Exception as exc:  # the others collected with it must still finish
                self.faults.note("on_done", exc)

"""HTTP POSTs for deliveries: one pycurl multi handle driven by an asyncio event loop.

libcurl tells us which sockets to watch (M_SOCKETFUNCTION) and when its next
timeout is due (M_TIMERFUNCTION); the event loop reports readiness back through
`socket_action`. No thread per request, no polling: an idle pool costs nothing, and one
process keeps hundreds of requests in flight.

One request's handle and result: engine/http_transfer.py. Response bodies: the first
`max_body` bytes are kept and the rest is read and discarded, because aborting a
transfer makes libcurl close the connection, and keep-alive is worth far more than the
bytes saved. A body larger than `max_drain` is aborted anyway (the status line is known
by then, so the attempt still counts as answered): an endless body must not hold a slot
until timeout.
"""

import asyncio
import contextlib
import os
import time
import warnings
from functools import lru_cache, partial
from urllib.parse import urlsplit

import pycurl

from engine.curl_faults import FaultLog
from engine.http_transfer import (
    HttpResult,
    OnDone,
    Transfer,
    failed_result,
)
from engine.oplog import log_event
from engine.targets import (
    Allowance,
    Lookup,
    TargetRefused,
    TargetUnresolvable,
    cached_pin,
    check_host,
    resolve_and_check_async,
    system_lookup,
)

DEFAULT_MAX_BODY = 4096
DEFAULT_MAX_DRAIN = 1 << 20
MAX_CONNECT_TIMEOUT_MS = 5000

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


def _resolve_entry(url: str, pin: str) -> list[str]:
    """The CURLOPT_RESOLVE list that makes curl connect to `pin` for this URL's host."""
    host, port = host_port(url)
    address = f"[{pin}]" if ":" in pin else pin
    return [f"{host}:{port}:{address}"]


class CurlPool:
    """Concurrent HTTP/1.1 POSTs over one CurlMulti, driven by the running event loop.

    Create it inside the loop that will use it. Easy handles are recycled so that
    the multi handle's connection cache keeps connections alive across requests.
    `lookup` resolves destination names for the connect-time check (engine/targets.py).
    """

    def __init__(
        self,
        max_connects: int = 512,
        max_host_connections: int = 0,
        max_body: int = DEFAULT_MAX_BODY,
        max_drain: int = DEFAULT_MAX_DRAIN,
        lookup: Lookup = system_lookup,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._lookup = lookup
        self._max_body = max_body
        self._max_drain = max_drain
        self._max_connects = max_connects
        self._max_host_connections = max_host_connections
        self.faults = FaultLog()
        self.rebuilds = 0  # times the multi handle was found unusable and replaced
        self._multi = self._new_multi()
        self._free: list[Transfer] = []
        self._active: dict[pycurl.Curl, Transfer] = {}
        self._watched: dict[int, int] = {}  # fd -> POLL_* currently registered
        # Kept-alive connections curl stopped watching, whose reader stays registered:
        # curl drops a connection's watch after every response and asks for it again with
        # the next request on it, and a reader removed and re-added each time costs a
        # quarter of a worker's CPU. Such a reader is removed when it fires (the peer
        # closed or sent something unasked) or when curl closes the socket.
        self._idle_readers: set[int] = set()
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._timer_due = 0.0
        self._closed = False
        self._checking: set[asyncio.Task[HttpResult]] = set()  # first lookups of a host

    def _new_multi(self) -> pycurl.CurlMulti:
        multi = pycurl.CurlMulti()
        multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        multi.setopt(pycurl.M_MAXCONNECTS, self._max_connects)
        multi.setopt(pycurl.M_MAX_HOST_CONNECTIONS, self._max_host_connections)
        return multi

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
    ) -> None:
        """Begin a POST; `on_done` gets its result from the event loop (see OnDone)."""
        self._begin(url, headers, body, timeout_ms, pin, on_done)

    async def post(
        self,
        url: str,
        headers: list[str],
        body: bytes,
        timeout_ms: int,
        pin: str | None = None,
    ) -> HttpResult:
        """POST `body` to `url`; with `pin`, connect to that address whatever DNS says."""
        future: asyncio.Future[HttpResult] = self._loop.create_future()

        def settle(result: HttpResult | None) -> None:
            if future.done():
                return
            if result is None:
                future.cancel()
            else:
                future.set_result(result)

        transfer = self._begin(url, headers, body, timeout_ms, pin, settle)
        try:
            return await future
        except asyncio.CancelledError:
            if self._active.get(transfer.curl) is transfer:
                self._release(transfer)
            raise

    def _begin(
        self, url: str, headers: list[str], body: bytes, timeout_ms: int, pin: str | None,
        on_done: OnDone,
    ) -> Transfer:
        if self._closed:
            raise RuntimeError("CurlPool is closed")
        transfer = self._free.pop() if self._free else Transfer(
            self._max_body, self._max_drain, self._on_close_socket
        )
        curl = transfer.curl
        curl.setopt(pycurl.HTTPHEADER, headers)
        curl.setopt(pycurl.POSTFIELDSIZE, len(body))
        curl.setopt(pycurl.POSTFIELDS, body)
        # A handle keeps its options: what the previous request on it already set (the
        # same destination, most of the time) is not set again.
        if (url, timeout_ms, pin) != transfer.target:
            transfer.target = (url, timeout_ms, pin)
            curl.setopt(pycurl.URL, url)
            curl.setopt(pycurl.TIMEOUT_MS, timeout_ms)
            curl.setopt(pycurl.CONNECTTIMEOUT_MS, min(timeout_ms, MAX_CONNECT_TIMEOUT_MS))
            # Entries land in the multi's shared DNS cache; a later unpinned request to the
            # same host:port may use them too, which only ever points at a checked address.
            curl.setopt(pycurl.RESOLVE, [] if pin is None else _resolve_entry(url, pin))
        transfer.start(on_done)
        self._active[curl] = transfer
        try:
            self._multi.add_handle(curl)
        except pycurl.error as exc:
            # The multi is dead (see engine/curl_faults.py): replace it, then try once
            # more on the new one. This request fails as an attempt only if that fails too.
            del self._active[curl]
            self._rebuild(exc)
            self._active[curl] = transfer
            try:
                self._multi.add_handle(curl)
            except pycurl.error as again:
                del self._active[curl]
                transfer.on_done = None
                self._loop.call_soon(
                    on_done, failed_result(f"internal: {again}", transfer.started_at))
        return transfer

    async def post_checked(
        self,
        url: str,
        headers: list[str],
        body: bytes,
        timeout_ms: int,
        allow_private: Allowance,
    ) -> HttpResult:
        """`post` after the connect-time target check; a refused or unresolvable
        target becomes a failed result (`refused_target` / `dns`), not an exception."""
        if allow_private is True:
            return await self.post(url, headers, body, timeout_ms)
        started_at = time.time()
        try:
            known, pin = _ready_pin(url, allow_private, self._lookup)
            if not known:
                pin = await resolve_and_check_async(*host_port(url), allow_private,
                                                    self._lookup)
        except (TargetRefused, TargetUnresolvable) as exc:
            return failed_result(_target_error(exc), started_at)
        return await self.post(url, headers, body, timeout_ms, pin)

    def start_checked(
        self,
        url: str,
        headers: list[str],
        body: bytes,
        timeout_ms: int,
        allow_private: Allowance,
        on_done: OnDone,
    ) -> None:
        """`start` after the connect-time target check. A host whose checked address is
        cached (the usual case) starts at once; only the first request to a host in a
        while waits for its lookup, as a task. A refused target reaches `on_done` as a
        failed result, from the loop like every other result."""
        if allow_private is True:
            self._begin(url, headers, body, timeout_ms, None, on_done)
            return
        try:
            known, pin = _ready_pin(url, allow_private, self._lookup)
        except (TargetRefused, TargetUnresolvable) as exc:
            self._loop.call_soon(on_done, failed_result(_target_error(exc), time.time()))
            return
        if known:
            self._begin(url, headers, body, timeout_ms, pin, on_done)
            return
        task = self._loop.create_task(
            self.post_checked(url, headers, body, timeout_ms, allow_private))
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
        self._cancel_timer()
        for fd in list(self._watched):
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
        self._watched.clear()
        self._idle_readers.clear()
        # The multi first: closing its cached connections calls the close-socket callback
        # of the easy handles that opened them, which must still exist. pycurl cannot run
        # a Python callback from inside multi.close and warns once per connection; the
        # sockets are closed all the same (no reader of ours is left on them by now).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "closesocket_callback", RuntimeWarning)
            self._multi.close()
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
        self._cancel_timer()
        for fd in list(self._watched):
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
        self._watched.clear()
        self._idle_readers.clear()
        self._multi = self._new_multi()
        with warnings.catch_warnings():  # as in close: the sockets are closed all the same
            warnings.filterwarnings("ignore", "closesocket_callback", RuntimeWarning)
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

    # libcurl callbacks. They must not raise (see engine/curl_faults.py) and must not call
    # back into the multi.

    def _on_socket(self, what: int, fd: int, multi: pycurl.CurlMulti, socketp: object) -> None:
        try:
            self._watch(what, fd)
        except Exception as exc:
            self.faults.note("socket_callback", exc)
            self._watched.pop(fd, None)
            self._idle_readers.discard(fd)
            with contextlib.suppress(Exception):
                self._loop.remove_reader(fd)
                self._loop.remove_writer(fd)
            # curl must learn that this socket is not watched: an error event on it, from
            # the loop, fails the transfer using it instead of leaving it to its timeout.
            self._loop.call_soon(self._act, fd, pycurl.CSELECT_ERR)

    def _watch(self, what: int, fd: int) -> None:
        # POLL_IN = 1 and POLL_OUT = 2 are bits (POLL_INOUT = 3); POLL_REMOVE = 4 means none.
        wanted = what & pycurl.POLL_INOUT
        watched = self._watched.get(fd, 0)
        if wanted & pycurl.POLL_IN:
            self._idle_readers.discard(fd)
        elif watched & pycurl.POLL_IN:
            self._idle_readers.add(fd)
            wanted |= pycurl.POLL_IN  # stays registered until it fires or the socket closes
        changed = wanted ^ watched
        if not changed:
            return
        try:
            self._register(fd, wanted, changed)
        except RuntimeError as exc:
            # A closed poll handle left over by uvloop (see engine/curl_faults.py): drop
            # it, then register everything wanted on a fresh one.
            self.faults.note("closed_poll_handle", exc)
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
            self._register(fd, wanted, wanted)
        if wanted:
            self._watched[fd] = wanted
        else:
            del self._watched[fd]

    def _register(self, fd: int, wanted: int, changed: int) -> None:
        loop = self._loop
        if changed & pycurl.POLL_IN:
            loop.add_reader(fd, self._on_readable, fd)
        if changed & pycurl.POLL_OUT:
            if wanted & pycurl.POLL_OUT:
                loop.add_writer(fd, self._on_writable, fd)
            else:
                loop.remove_writer(fd)

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

    def _on_close_socket(self, fd: int) -> int:
        self._idle_readers.discard(fd)
        try:
            if self._watched.pop(fd, None) is not None and not self._closed:
                self._loop.remove_reader(fd)
                self._loop.remove_writer(fd)
        except Exception as exc:  # a callback of libcurl's: never raise into it
            self.faults.note("close_socket_callback", exc)
        try:
            os.close(fd)
        except OSError as exc:
            self.faults.note("close_socket", exc)
        return 0

    def _on_readable(self, fd: int) -> None:
        if fd in self._idle_readers:
            # An idle connection: curl sees whatever this is when it next uses it.
            self._idle_readers.discard(fd)
            self._loop.remove_reader(fd)
            watched = self._watched[fd] & ~pycurl.POLL_IN
            if watched:
                self._watched[fd] = watched
            else:
                del self._watched[fd]
            return
        self._act(fd, pycurl.CSELECT_IN)

    def _on_writable(self, fd: int) -> None:
        self._act(fd, pycurl.CSELECT_OUT)

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

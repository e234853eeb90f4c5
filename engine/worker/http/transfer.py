"""One POST's easy handle and what its answer comes to: `HttpResult`, with libcurl's
error codes named (attempt history and metrics show the names).

The pool that drives many of these over one multi handle is engine/worker/http/client.py.
"""

import errno
import time
from collections.abc import Callable

import msgspec
import pycurl

from engine.webhooks.egress import EgressOptions

TLS_ERRORS = frozenset(
    code
    for name in (
        "E_SSL_CONNECT_ERROR",
        "E_PEER_FAILED_VERIFICATION",
        "E_SSL_CERTPROBLEM",
        "E_SSL_CIPHER",
        "E_SSL_CACERT_BADFILE",
        "E_SSL_ISSUER_ERROR",
        "E_SSL_PINNEDPUBKEYNOTMATCH",
        "E_SSL_INVALIDCERTSTATUS",
        "E_SSL_CRL_BADFILE",
        "E_SSL_SHUTDOWN_FAILED",
        "E_SSL_ENGINE_NOTFOUND",
        "E_SSL_ENGINE_SETFAILED",
        "E_SSL_ENGINE_INITFAILED",
        "E_USE_SSL_FAILED",
    )
    if (code := getattr(pycurl, name, None)) is not None
)
ERROR_NAMES = {
    pycurl.E_OPERATION_TIMEDOUT: "timeout",
    pycurl.E_COULDNT_RESOLVE_HOST: "dns",
    pycurl.E_SEND_ERROR: "send",
    pycurl.E_RECV_ERROR: "recv",
    pycurl.E_GOT_NOTHING: "recv",
    pycurl.E_PARTIAL_FILE: "recv",
    pycurl.E_TOO_MANY_REDIRECTS: "too_many_redirects",
    # Not HTTP: a garbage status line (8), or no status line at all (HTTP/0.9, which
    # curl refuses as 1, "unsupported protocol"). Which of the two an endpoint gets
    # depends on how much of its answer the first read sees, so they share one name.
    pycurl.E_FTP_WEIRD_SERVER_REPLY: "invalid_response",  # CURLE_WEIRD_SERVER_REPLY
    pycurl.E_UNSUPPORTED_PROTOCOL: "invalid_response",
} | {code: "tls" for code in TLS_ERRORS}


class HttpResult(msgspec.Struct, gc=False):
    """The outcome of one POST. `status_code` may be set together with `error`
    (e.g. a timeout while reading the body): only `ok` means delivered."""

    status_code: int | None
    body: bytes
    error: str | None
    duration_ms: float
    retry_after: float | None
    started_at: float

    @property
    def ok(self) -> bool:
        return self.error is None and self.status_code is not None and 200 <= self.status_code < 300


# Called once per request from the event loop with its result, or with None when the pool
# is closed first. A plain callback, not a future: a future, its done-callback and the
# loop's call_soon cost a worker several microseconds per delivery
# (docs/decisions/0011-callbacks-and-untracked-structs-per-delivery.md).
OnDone = Callable[[HttpResult | None], None]


def failed_result(error: str, started_at: float) -> HttpResult:
    """The result of a request that never reached the network."""
    return HttpResult(
        status_code=None, body=b"", error=error,
        duration_ms=(time.time() - started_at) * 1000.0, retry_after=None,
        started_at=started_at,
    )


# Through a proxy, the engine connects to the proxy only: a connect that fails, a name of
# the proxy's that does not resolve, a refused or failed CONNECT is the proxy's failure,
# recorded as `proxy` (docs/decisions/0034-egress.md). CURLE_PROXY (97) is newer than
# pycurl's constants.
PROXY_ERRORS = frozenset({pycurl.E_COULDNT_RESOLVE_PROXY, pycurl.E_COULDNT_CONNECT,
                          getattr(pycurl, "E_PROXY", 97)})


def classify_error(code: int, message: str, os_errno: int) -> str:
    """Short, stable error text for attempt history and metrics."""
    if code == pycurl.E_COULDNT_CONNECT:
        return "connect_refused" if os_errno == errno.ECONNREFUSED else "connect"
    name = ERROR_NAMES.get(code)
    return name if name is not None else f"curl:{code} {message}"



class Transfer:
    """One reusable easy handle and the state of the request it is carrying."""

    __slots__ = (
        "body",
        "ca_bundle",
        "curl",
        "drain_aborted",
        "egress",
        "max_body",
        "max_drain",
        "on_done",
        "received",
        "started_at",
        "started_mono",
        "target",
    )

    def __init__(self, max_body: int, max_drain: int, ca_bundle: bytes | None = None) -> None:
        self.max_body = max_body
        self.max_drain = max_drain
        self.body = bytearray()
        self.received = 0
        self.drain_aborted = False
        self.on_done: OnDone | None = None
        self.started_at = 0.0
        self.started_mono = 0.0
        # (url, timeout_ms, pin, proxy pin) set
        self.target: tuple[str, int, str | None, str | None] | None = None
        self.egress: EgressOptions | None = None  # the egress options set, by identity
        self.ca_bundle = ca_bundle  # --ca-bundle: trusted for every destination
        self.curl = pycurl.Curl()
        self._set_fixed_options()

    def _set_fixed_options(self) -> None:
        """Options that never change, set once (and again after a reset); per-request
        ones in CurlPool._begin."""
        curl = self.curl
        curl.setopt(pycurl.NOSIGNAL, 1)
        curl.setopt(pycurl.FOLLOWLOCATION, 0)
        curl.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        curl.setopt(pycurl.REDIR_PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        curl.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        curl.setopt(pycurl.TCP_NODELAY, 1)
        curl.setopt(pycurl.POST, 1)
        curl.setopt(pycurl.WRITEFUNCTION, self._on_body)
        # No CLOSESOCKETFUNCTION: libcurl closes its sockets itself, after telling the pool
        # to stop watching them (docs/decisions/0020-the-loop-watches-one-epoll-per-pool.md).
        if self.ca_bundle is not None:
            self._trust_only(self.ca_bundle)

    def _trust_only(self, bundle: bytes) -> None:
        """Trust these CAs and no others (as curl --cacert), for the destination and an
        https proxy alike."""
        curl = self.curl
        curl.setopt(pycurl.CAINFO_BLOB, bundle)
        curl.setopt(pycurl.PROXY_CAINFO_BLOB, bundle)
        curl.unsetopt(pycurl.CAPATH)
        curl.unsetopt(pycurl.PROXY_CAPATH)

    def use_egress(self, egress: EgressOptions | None) -> None:
        """Set a destination's egress options on this handle: certificates and keys as
        blobs (libcurl copies them; nothing is written to a file), the proxy tunnelled.
        A handle that carried other egress options is reset first, so none of them
        leaks into another destination's requests. libcurl reuses a connection only for
        a request with the same TLS settings, client certificate included: connections
        with a client certificate are kept alive as any other."""
        if self.egress is not None:
            self.curl.reset()
            self._set_fixed_options()
        self.egress = egress
        self.target = None
        if egress is None:
            return
        curl = self.curl
        if egress.client_cert is not None and egress.client_key is not None:
            curl.setopt(pycurl.SSLCERT_BLOB, egress.client_cert)
            curl.setopt(pycurl.SSLCERTTYPE, "PEM")
            curl.setopt(pycurl.SSLKEY_BLOB, egress.client_key)
            curl.setopt(pycurl.SSLKEYTYPE, "PEM")
        if egress.ca_bundle is not None:
            self._trust_only(egress.ca_bundle)
        if egress.proxy is not None:
            curl.setopt(pycurl.PROXY, egress.proxy)
            # Every request through a proxy is a tunnel whose CONNECT names the address the
            # target check pinned (CONNECT_TO, CurlPool._begin): the proxy never resolves
            # a destination's name itself (docs/decisions/0034-egress.md).
            curl.setopt(pycurl.HTTPPROXYTUNNEL, 1)

    def start(self, on_done: OnDone) -> None:
        self.body.clear()
        self.received = 0
        self.drain_aborted = False
        self.on_done = on_done
        self.started_at = time.time()
        self.started_mono = time.monotonic()

    def _on_body(self, chunk: bytes) -> int | None:
        self.received += len(chunk)
        room = self.max_body - len(self.body)
        if room > 0:
            self.body += chunk[:room]
        elif self.received > self.max_drain:
            self.drain_aborted = True
            return 0  # abort: libcurl reports E_WRITE_ERROR
        return None

    def result(self, code: int, message: str) -> HttpResult:
        curl = self.curl
        status = curl.getinfo(pycurl.RESPONSE_CODE) or None
        if code == 0 or (code == pycurl.E_WRITE_ERROR and self.drain_aborted):
            error = None
        elif self.egress is not None and self.egress.proxy is not None and (
                code in PROXY_ERRORS or curl.getinfo(pycurl.HTTP_CONNECTCODE) not in (0, 200)):
            error, status = "proxy", None
        else:
            error = classify_error(code, message, curl.getinfo(pycurl.OS_ERRNO))
        return HttpResult(
            status_code=status,
            body=bytes(self.body),
            error=error,
            duration_ms=(time.monotonic() - self.started_mono) * 1000.0,
            # libcurl parses Retry-After (seconds or HTTP-date, capped at 6 h), which
            # spares a Python header callback per line of every response; 0 = none.
            retry_after=(
                None if status is None or status < 300 else curl.getinfo(pycurl.RETRY_AFTER) or None
            ),
            started_at=self.started_at,
        )

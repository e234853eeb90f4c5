"""Faults of the HTTP client's machinery (not of a destination), logged once per kind.

libcurl calls CurlPool's socket and timer callbacks from inside `socket_action` and
`add_handle`. An exception there cannot be handed back: pycurl turns it into an error
return, and libcurl then marks the whole multi handle dead (CURLM_ABORTED_BY_CALLBACK,
code 11), after which every later call fails ("multi_socket_action failed",
"curl_multi_add_handle() failed due to internal errors"), and the worker died of it. So
the callbacks catch everything, and what they could not do is logged here once per kind
(a hostile endpoint can cause thousands) and repaired by the pool.

Kinds: `socket_callback`, `timer_callback` (a callback failed; the transfer or timeout is
handed back to libcurl from the loop), `multi_unusable` (the multi handle was rebuilt),
`on_done` (a result callback raised: a bug), `closed_while_watched` (a socket left the
pool's epoll without libcurl's POLL_REMOVE first; harmless by design, counted to show it
happens: docs/decisions/0020-the-loop-watches-one-epoll-per-pool.md). The first fault of
this kind, uvloop's closed poll handle after a reset, is gone with that design: the loop
watches no socket of libcurl's.
"""

from __future__ import annotations

from collections import Counter

from engine.observe.oplog import log_event


class FaultLog:
    """One JSON log line the first time each kind of fault happens in this process; all
    of them are counted (`counts`)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def note(self, kind: str, exc: BaseException | str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] == 1:
            log_event("http_client_fault", kind=kind, error=repr(exc)[:300],
                      note="logged once per process; later ones are only counted")

"""Faults of the HTTP client's machinery (not of a destination), logged once per kind.

libcurl calls CurlPool's socket and timer callbacks from inside `socket_action` and
`add_handle`. An exception there cannot be handed back: pycurl turns it into an error
return, and libcurl then marks the whole multi handle dead (CURLM_ABORTED_BY_CALLBACK,
code 11), after which every later call fails ("multi_socket_action failed",
"curl_multi_add_handle() failed due to internal errors"), and the worker died of it. So
the callbacks catch everything, and what they could not do is logged here once per kind
(a hostile endpoint can cause thousands) and repaired by the pool.

The fault that started it: uvloop closes its poll handle for a socket when epoll reports
an error on it (a TCP reset: EPOLLERR), but keeps the closed handle in its table, so the
next `add_reader`/`add_writer` of that fd raises "unable to perform operation on
<UVPoll closed=True>". `remove_reader` and `remove_writer` drop the closed handle; adding
works again after them.
"""

from __future__ import annotations

from collections import Counter

from engine.oplog import log_event


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

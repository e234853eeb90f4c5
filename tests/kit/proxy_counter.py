"""A proxy.py plugin that writes one line per request it passes upstream (its method and
the host:port asked for) to the file named by ENGINE_TEST_PROXY_LOG: what the tests count
(tests/kit/forward_proxy.py). The proxy itself is proxy.py's, unchanged."""

from __future__ import annotations

import os

from proxy.http.parser import HttpParser
from proxy.http.proxy import HttpProxyBasePlugin


class CountingPlugin(HttpProxyBasePlugin):
    def before_upstream_connection(self, request: HttpParser) -> HttpParser | None:
        host = (request.host or b"").decode()
        method = (request.method or b"").decode()
        with open(os.environ["ENGINE_TEST_PROXY_LOG"], "a") as log:
            log.write(f"{method} {host}:{request.port}\n")
        return request

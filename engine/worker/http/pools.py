"""A worker's HTTP client: several CurlPools, a busy host's requests spread over them.

Why more than one multi handle: to reuse a kept-alive connection, libcurl walks every
connection its multi handle has open to the request's host (Curl_cpool_find, then
url_match_conn for each), so with a thousand requests in flight to one host every new
request pays for a thousand comparisons; several pools cost less client CPU per POST
(docs/decisions/0016, measured with `python -m tools.http_client_bench`).

A host's requests go to its own pool (by hash) until SPREAD of them are in flight there,
then to the next pool, and so on. A destination with a few requests at a time therefore
keeps one pool and reuses its connections as with a single multi handle; only a host with
more than SPREAD in flight opens connections in a second pool. The pools split the
connection cache between them (max_connects each), as hosts are split between them.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

from engine.webhooks.egress import EgressOptions
from engine.webhooks.targets import Allowance, Lookup, system_lookup
from engine.worker.http.client import CurlPool, HttpResult, host_port
from engine.worker.http.transfer import OnDone

# Requests in flight to one host in one pool before the next pool takes them. A first
# round-robin try over K pools (two rounds, the results file above) put 1,024 in flight
# over 8 pools ahead of 1, 4, 16 and 32.
SPREAD = 128


class CurlPools:
    """`start_checked` and `close` of a CurlPool, over max(1, capacity // SPREAD) of them."""

    def __init__(
        self, capacity: int, spread: int = SPREAD, lookup: Lookup = system_lookup,
        ca_bundle: bytes | None = None,
    ) -> None:
        count = max(1, capacity // spread)
        self.spread = spread
        self.pools = [CurlPool(max_connects=-(-capacity // count), lookup=lookup,
                               ca_bundle=ca_bundle)
                      for _ in range(count)]
        # host:port -> requests in flight to it in each pool
        self._in_flight: dict[tuple[str, int], list[int]] = {}

    @property
    def in_flight(self) -> int:
        return sum(pool.in_flight for pool in self.pools)

    def start_checked(
        self, url: str, headers: list[str], body: bytes, timeout_ms: int,
        allow_private: Allowance, on_done: OnDone, egress: EgressOptions | None = None,
    ) -> None:
        """CurlPool.start_checked on the pool this request's host is due to use."""
        host = host_port(url)
        counts = self._in_flight.get(host)
        if counts is None:
            counts = self._in_flight[host] = [0] * len(self.pools)
        index = self._pick(host, counts)
        counts[index] += 1
        self.pools[index].start_checked(url, headers, body, timeout_ms, allow_private,
                                        partial(self._done, host, counts, index, on_done),
                                        egress)

    def _pick(self, host: tuple[str, int], counts: list[int]) -> int:
        """The host's own pool, or the first after it with fewer than `spread` of its
        requests in flight; if every pool has that many, the least busy."""
        size = len(counts)
        first = hash(host) % size
        for step in range(size):
            index = (first + step) % size
            if counts[index] < self.spread:
                return index
        return counts.index(min(counts))

    def _done(self, host: tuple[str, int], counts: list[int], index: int, on_done: OnDone,
              result: HttpResult | None) -> None:
        counts[index] -= 1
        if not any(counts):
            del self._in_flight[host]  # hosts come and go: keep only those in use
        on_done(result)

    def fault_counts(self) -> dict[str, int]:
        """Faults of the client's machinery counted by all the pools (curl_faults.py)."""
        total: Counter[str] = Counter()
        for pool in self.pools:
            total.update(pool.faults.counts)
        return dict(total)

    async def close(self) -> None:
        """Close every pool: what is still in flight comes back as None (CurlPool.close)."""
        for pool in self.pools:
            await pool.close()

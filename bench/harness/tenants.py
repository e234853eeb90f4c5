"""What the tenant scenarios (noisy-neighbour, tenants-10k) share: the engine's API over
HTTP (tenants, keys, destinations, events), tenants and destinations created in bulk with
the API's own statements, a backlog filled per tenant and made due at once, and the
numbers they report (nearest-rank percentiles, ratios, medians)."""

from __future__ import annotations

import json
import math
import statistics
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

from bench.harness import stack
from engine.config import Settings
from engine.db import queries
from engine.db.sql_params import ApiDestinationCreateParams, TenantCreateParams
from engine.webhooks.signing import generate_secret

SQL = Path(__file__).with_name("sql")
FILL_TENANT_BACKLOG = (SQL / "fill_tenant_backlog.sql").read_text()
TENANT_BACKLOG_DUE = (SQL / "tenant_backlog_due.sql").read_text()
# About 1 KB of JSON, as in the drains.
PAYLOAD = json.dumps({"type": "order.created", "data": {"items": ["x" * 40] * 20, "n": 0}})
API_TIMEOUT_S = 30.0


def percentiles(values: Sequence[float], qs: Sequence[float] = (0.5, 0.95, 0.99)
                ) -> dict[str, float | None]:
    """Nearest-rank percentiles (the smallest value with at least q of them at or below
    it) and the maximum, keyed p50, p95, p99, max; None for no values."""
    ordered = sorted(values)
    found: dict[str, float | None] = {}
    for q in qs:
        key = f"p{q * 100:g}"
        found[key] = ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else None
    found["max"] = ordered[-1] if ordered else None
    return found


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator to 3 places; None if either is missing or the denominator
    is zero."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values that are there (None: a run that measured nothing)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


class Api:
    """The engine's HTTP API at `base_url`: the admin calls carry no token (the bench's
    engines run without ENGINE_API_TOKEN, so every caller without a key is the admin),
    a tenant's calls its key."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def call(self, method: str, path: str, body: object, key: str | None = None
             ) -> dict[str, Any]:
        request = urllib.request.Request(self.base_url + path, json.dumps(body).encode(),
                                         method=method)
        request.add_header("content-type", "application/json")
        if key is not None:
            request.add_header("authorization", f"Bearer {key}")
        with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as response:
            result: dict[str, Any] = json.load(response)
        return result


class ApiTenant(NamedTuple):
    """A tenant made through the API: its id and uid, its key, its one destination."""

    id: int
    uid: str
    key: str
    destination_id: int


def tenant_through_api(api: Api, uid: str, url: str) -> ApiTenant:
    """POST /v1/tenants, POST /v1/tenants/{uid}/keys (all scopes), then POST
    /v1/destinations with that key: the destination is the tenant's because its key made
    it."""
    tenant = api.call("POST", "/v1/tenants", {"uid": uid, "name": f"bench {uid}"})
    key = api.call("POST", f"/v1/tenants/{uid}/keys", {"name": "bench"})["key"]
    destination = api.call("POST", "/v1/destinations", {"url": url}, key)
    return ApiTenant(int(tenant["id"]), uid, key, int(destination["id"]))


def create_tenants(conn: psycopg.Connection, uids: Sequence[str]) -> list[int]:
    """Tenants as POST /v1/tenants writes them (its statement, tenant_create.sql, with the
    values its handler passes: the uid, a name, no metadata), in one pipelined batch.
    Their ids, in the order of `uids`."""
    with conn.transaction():
        psycopg.RawCursor(conn).executemany(
            queries.TENANT_CREATE.sql,
            [TenantCreateParams(uid=uid, name=f"bench {uid}", metadata=None) for uid in uids])
    ids = dict(conn.execute("SELECT uid, id FROM tenants WHERE uid = ANY(%s)",
                            (list(uids),)).fetchall())
    return [int(ids[uid]) for uid in uids]


def create_destinations(conn: psycopg.Connection, targets: Sequence[tuple[int, str]]
                        ) -> list[int]:
    """Destinations (tenant id, url) as POST /v1/destinations with only a url writes them
    (api_destination_create.sql; a fresh secret each, the engine's default timeout, no
    cap, limit, filter, headers or schedule), in one pipelined batch. Their ids, in order."""
    timeout_ms = Settings().default_timeout_ms
    rows = [ApiDestinationCreateParams(
        url=url, secret=generate_secret(), event_types=None, max_in_flight=None,
        ordered=False, timeout_ms=timeout_ms, rate_limit=None, headers=None,
        retry_schedule=None, tenant_id=tenant_id, filter=None, filter_path=None,
        channels=None) for tenant_id, url in targets]
    with conn.transaction():
        cursor = psycopg.RawCursor(conn)
        cursor.executemany(queries.API_DESTINATION_CREATE.sql, rows, returning=True)
        ids = []
        while True:
            row = cursor.fetchone()
            assert row is not None
            ids.append(int(row[0]))
            if not cursor.nextset():
                break
    return ids


def fill_backlog(conn: psycopg.Connection, destinations: Sequence[int],
                 tenants: Sequence[int], count: int, due_in_s: float) -> int:
    """`count` deliveries, one event each, to `destinations` in turn (each with its
    tenant, `tenants` in the same order), in one transaction, due `due_in_s` after the
    fill (all at the same moment), then the NOTIFY ingress sends after a commit. Returns
    that moment as unix ms (the server's clock, the machine's)."""
    with conn.transaction():
        stack.run_sql(conn, FILL_TENANT_BACKLOG,
                      (count, list(destinations), list(tenants), PAYLOAD))
        due_ms, moved = stack.run_sql(conn, TENANT_BACKLOG_DUE,
                                      (due_in_s, sorted(set(tenants))))[0]
    if moved != count:
        raise stack.BenchError(f"the backlog holds {moved} deliveries, not {count}")
    conn.execute(stack.NOTIFY)
    return int(due_ms)

"""The engine's domain types: what is claimed, what an attempt came to, what is enqueued,
how breakers behave, and who holds a claim. No I/O here (engine/db/queue.py runs them)."""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

# Breaker defaults (SPEC): open after 5 consecutive failures, pause 30 s doubling to 1 h.
BREAKER_THRESHOLD = 5
BREAKER_BASE_PAUSE_MS = 30_000
BREAKER_MAX_PAUSE_MS = 3_600_000


def worker_id(tag: str = "", pid: int | None = None) -> str:
    """`host:pid` (plus a tag), so an operator can tell whose claim a row is. A supervisor
    passes a child's `pid` to name that child's claims."""
    base = f"{socket.gethostname()}:{os.getpid() if pid is None else pid}"
    return f"{base}:{tag}" if tag else base


class Claim(msgspec.Struct, frozen=True, gc=False):
    """One claimed delivery with all a worker needs to send it. gc=False (here, in Result
    and HttpResult): made per delivery and never in a reference cycle, so the cyclic
    collector need not track them, and a worker's collections stay short
    (docs/decisions/0011-callbacks-and-untracked-structs-per-delivery.md)."""

    id: int
    event_id: int
    destination_id: int
    attempt: int
    url: str
    timeout_ms: int
    secrets: list[str]
    payload: str
    max_in_flight: int | None = None  # the destination's cap on concurrent requests
    headers: dict[str, str] | None = None  # the destination's static extra headers
    retry_schedule: list[float] | None = None  # its own retry delays (seconds), if any
    rate_limit: float | None = None  # its requests per second, if limited
    # Its egress settings' revision (mutual TLS, a proxy, OAuth2: schema/023_egress.sql),
    # None without any: the worker reads the settings once per revision (engine/worker/egress.py).
    egress_revision: int | None = None
    # The W3C traceparent its event was posted with (the parent of the attempt's span),
    # and whether the destination's POSTs carry one (schema/024_tracing.sql).
    traceparent: str | None = None
    propagate_trace: bool = False
    tenant_id: int | None = None  # its tenant, for the span
    claim_token: int | None = None  # names this claim; its results carry it (schema/009)
    # This claim filled its destination's max_in_flight: claimers are being turned away
    # until a slot comes back, so the worker records its results sooner
    # (engine/worker/recorder.py, SLOT_FLUSH_INTERVAL_S).
    fills_cap: bool = False
    # This claim took a slot under its destination's max_in_flight (claim_batch.sql,
    # refill_slots.sql); a spare (refill_slots.sql) takes none until a result hands it
    # one (record_results.sql, `handed`).
    holds_slot: bool = False
    # A rate-limited destination's delivery may be sent no earlier than send_at (the
    # database's clock), send_delay_s after the claim statement: take_rate_tokens.sql.
    send_at: dt.datetime | None = None
    send_delay_s: float = 0.0


OUTCOMES = frozenset({"delivered", "retry", "dead", "gone", "released"})


class Result(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """The outcome of one attempt. `next_attempt_at` is set for 'retry' and 'gone'.
    A Struct, not a dataclass: a worker makes one per delivery (several times cheaper).
    omit_defaults: the JSON document of a batch (record_results.sql) names only the
    fields that are set; json_to_recordset reads a missing key as NULL, and most of a
    success's fields are."""

    id: int
    attempt: int
    outcome: str
    started_at: dt.datetime
    duration_ms: int | None = None
    status_code: int | None = None
    error: str | None = None
    body: str | None = None
    next_attempt_at: dt.datetime | None = None
    # The claim's token: the result applies only while that claim is the current one.
    claim_token: int | None = None
    # A success that handed its capped slot straight on to a spare claim (the worker sent
    # the spare the moment this answer came): that claim's id and token.
    slot_to: int | None = None
    slot_to_token: int | None = None


@dataclass(frozen=True)
class BreakerSettings:
    threshold: int = BREAKER_THRESHOLD
    base_pause_ms: int = BREAKER_BASE_PAUSE_MS
    max_pause_ms: int = BREAKER_MAX_PAUSE_MS


# The tenant of everything written before tenants, and of the unscoped API paths called
# with the admin token (schema/016_tenants.sql writes it first).
DEFAULT_TENANT_ID = 1


@dataclass
class EventIn:
    """One event to enqueue. `destination_ids` None means fan out by event type."""

    type: str
    payload: str
    destination_ids: Sequence[int] | None = None
    ordering_key: str | None = None
    idempotency_key: str | None = None
    request_hash: bytes | None = None
    tenant_id: int = DEFAULT_TENANT_ID
    # Its channels (SPEC "Routing"), as stored: engine/webhooks/routing.py channel_list.
    channels: Sequence[str] | None = None
    # Whether enqueue_events.sql may parse the payload as jsonb for filters: false only
    # for a payload it cannot hold (engine/webhooks/routing.py payload_is_filterable).
    filterable: bool = True
    # The W3C traceparent it was posted with, checked (engine/observe/tracing.py).
    traceparent: str | None = None

"""The request and response types of the HTTP API.

The same msgspec types decode (and validate) requests, encode responses and generate
/openapi.json, so the documented schema cannot drift from what the server does.
Strings that end up in text columns refuse NUL, which PostgreSQL cannot store.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Raw, UnsetType

MAX_ID = 2**63 - 1
MAX_BATCH_EVENTS = 1000
MAX_LIST_LIMIT = 1000
DEFAULT_LIST_LIMIT = 100
MAX_IN_FLIGHT_CAP = 10_000


def whole(body: str) -> str:
    """A pattern matching whole strings only, in Python (msgspec checks requests with re)
    and in JSON Schema (/openapi.json) alike: Python's `$` also matches before a final
    newline, so `^x$` would let "x\\n" through to a CHECK constraint or a header line;
    `(?!\\n)$` is the end of the string in both."""
    return f"^{body}(?!\\n)$"


_NO_NUL = "^[^\\x00]*$"
Id = Annotated[int, Meta(ge=1, le=MAX_ID)]
Name = Annotated[str, Meta(min_length=1, max_length=256, pattern=_NO_NUL)]
Key = Annotated[str, Meta(min_length=1, max_length=256, pattern=_NO_NUL)]
# Only the scheme is in the pattern; the rest of the URL policy is engine.webhooks.targets.
Url = Annotated[
    str, Meta(min_length=1, max_length=2048, pattern="^[hH][tT][tT][pP][sS]?://[^\\x00]*$")
]
Secret = Annotated[
    str,
    Meta(
        max_length=512,
        pattern=whole("whsec_(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)"),
    ),
]
EventTypes = Annotated[list[Name], Meta(max_length=1000)]
MaxInFlight = Annotated[int, Meta(ge=1, le=MAX_IN_FLIGHT_CAP)]
# The upper bound is the server's max_timeout_ms, checked by the handler.
TimeoutMs = Annotated[int, Meta(ge=1, le=2**31 - 1)]
# Per-destination options (engine/webhooks/destination_options.py checks what a schema cannot say:
# refused header names, CR/LF, value bytes, a non-decreasing schedule).
HeaderName = Annotated[str, Meta(pattern=whole("[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}"))]
HeaderValue = Annotated[str, Meta(max_length=1024)]
Headers = Annotated[
    dict[HeaderName, HeaderValue],
    Meta(max_length=20, description="Static request headers sent on every request; names"
         " webhook-*, content-type, content-length, host, user-agent, connection,"
         " transfer-encoding (and other hop-by-hop names, expect) are refused"),
]
RateLimit = Annotated[
    float, Meta(gt=0, le=1_000_000, description="Requests per second, across every process")
]
Duration = Annotated[str, Meta(max_length=32, pattern="^\\s*\\d+(\\.\\d+)?\\s*(ms|s|m|h|d)\\s*$")]
RetrySchedule = Annotated[
    list[Duration],
    Meta(min_length=1, max_length=50,
         description="Delays after each failed attempt, replacing the engine's schedule"),
]
EventType = Annotated[
    str, Meta(min_length=1, max_length=256, pattern=_NO_NUL,
              description="Types starting with `engine.` are reserved (operational events)"),
]
# Routing (SPEC "Routing"; engine/webhooks/routing.py checks what a schema cannot say:
# operators, paths, nesting, size).
ChannelName = Annotated[str, Meta(pattern=whole("[A-Za-z0-9._-]{1,128}"))]
Channels = Annotated[
    list[ChannelName],
    Meta(max_length=10, description="Channel names (1-128 of A-Z a-z 0-9 . _ -). An event"
         " with channels reaches only destinations subscribed to one of them; an event"
         " without reaches destinations whatever their channels"),
]
Filter = Annotated[
    dict[str, Any],
    Meta(description="Conditions on the payload, e.g. {\"customer.tier\": {\"$eq\":"
         " \"gold\"}}: dotted paths (a numeric segment indexes an array) to objects of"
         " $eq $neq $gt $gte $lt $lte $in $nin $exists, and $and/$or (lists of filters),"
         " $not (one filter); every condition must hold. Values compare by JSON type."
         " At most 10 levels deep and 4 KiB"),
]
DeliveryStatus = Literal["pending", "in_flight", "delivered", "dead"]
BreakerState = Literal["closed", "open", "half_open"]


# A time in an answer: RFC 3339 text, declared so in /openapi.json (msgspec says only
# "string"), so generated clients type it as a date-time.
Timestamp = Annotated[dt.datetime, Meta(extra_json_schema={"format": "date-time"})]


class _Request(msgspec.Struct, forbid_unknown_fields=True):
    pass


# Egress (engine/webhooks/egress.py checks what a schema cannot say: that a PEM parses, a
# key matches its certificate, a proxy's or token_url's address is allowed).
ClientPem = Annotated[str, Meta(min_length=1, max_length=16 * 1024, pattern=_NO_NUL)]
# A destination's own CAs: well under the request body's limit (256 KiB), so a bundle over
# it is a 422 naming the field, not a 413 for the whole body; --ca-bundle has no limit.
CaBundlePem = Annotated[str, Meta(min_length=1, max_length=192 * 1024, pattern=_NO_NUL)]
ProxyUrl = Annotated[str, Meta(min_length=1, max_length=2048, pattern=_NO_NUL,
                               description="http:// or https:// forward proxy")]
ClientId = Annotated[str, Meta(min_length=1, max_length=1024, pattern=_NO_NUL)]
ClientSecret = Annotated[str, Meta(min_length=1, max_length=4096, pattern=_NO_NUL)]
OAuthScope = Annotated[str, Meta(min_length=1, max_length=1024, pattern=_NO_NUL)]


class TlsSettings(_Request):
    """PEM text. The key is never returned; reads show the certificates' fingerprints."""

    client_cert: ClientPem | None = None
    client_key: ClientPem | None = None
    ca_bundle: CaBundlePem | None = None


class OAuth2ClientCredentials(_Request):
    type: Literal["oauth2_client_credentials"]
    token_url: Url
    client_id: ClientId
    client_secret: ClientSecret
    scope: OAuthScope | None = None


class TlsInfo(msgspec.Struct):
    """What a read shows of a destination's TLS settings: SHA-256 fingerprints (of the
    certificates' DER), never the key."""

    client_cert_sha256: str | None
    client_key_set: bool
    ca_bundle_sha256: list[str] | None


class AuthInfo(msgspec.Struct):
    """A destination's OAuth2 settings as read: without the client secret."""

    type: str
    token_url: str
    client_id: str
    scope: str | None
    client_secret_set: bool


class DestinationCreate(_Request):
    url: Url
    secret: Secret | None = None
    event_types: EventTypes | None = None
    max_in_flight: MaxInFlight | None = None
    ordered: bool = False
    timeout_ms: TimeoutMs | None = None
    rate_limit: RateLimit | None = None
    headers: Headers | None = None
    retry_schedule: RetrySchedule | None = None
    filter: Filter | None = None
    channels: Channels | None = None
    tls: TlsSettings | None = None
    proxy: ProxyUrl | None = None
    auth: OAuth2ClientCredentials | None = None
    # Its POSTs carry a `traceparent`: the attempt's span, else the event's own.
    propagate_trace: bool = False


class DestinationPatch(_Request):
    url: Url | UnsetType = UNSET
    event_types: EventTypes | UnsetType | None = UNSET
    max_in_flight: MaxInFlight | UnsetType | None = UNSET
    ordered: bool | UnsetType = UNSET
    timeout_ms: TimeoutMs | UnsetType = UNSET
    rate_limit: RateLimit | UnsetType | None = UNSET
    headers: Headers | UnsetType | None = UNSET
    retry_schedule: RetrySchedule | UnsetType | None = UNSET
    filter: Filter | UnsetType | None = UNSET
    channels: Channels | UnsetType | None = UNSET
    # Each replaces the whole setting (a key with its certificate, a secret with its
    # client id); null removes it.
    tls: TlsSettings | UnsetType | None = UNSET
    proxy: ProxyUrl | UnsetType | None = UNSET
    auth: OAuth2ClientCredentials | UnsetType | None = UNSET
    propagate_trace: bool | UnsetType = UNSET
    paused: bool | UnsetType = UNSET
    disabled: bool | UnsetType = UNSET
    rotate_secret: bool | UnsetType = UNSET


class Destination(msgspec.Struct):
    id: int
    url: str
    event_types: list[str] | None
    max_in_flight: int | None
    ordered: bool
    timeout_ms: int
    paused: bool
    disabled: bool
    disabled_reason: str | None
    paused_until: Timestamp | None
    breaker: BreakerState
    consecutive_failures: int
    created_at: Timestamp
    updated_at: Timestamp
    rate_limit: float | None
    headers: dict[str, str] | None
    retry_schedule: list[str] | None
    # The first failure since the last success: the auto-disable clock (null: healthy).
    failing_since: Timestamp | None
    tenant: str
    filter: dict[str, Any] | None
    channels: list[str] | None
    # Present only in the answer to a creation or a rotation.
    secret: str | UnsetType = UNSET
    previous_secret_until: Timestamp | None = None
    tls: TlsInfo | None = None
    proxy: str | None = None
    auth: AuthInfo | None = None
    propagate_trace: bool = False


class DestinationList(msgspec.Struct):
    data: list[Destination]


class EventCreate(_Request):
    type: EventType
    # Any JSON value, kept as the exact text received: it is what gets signed and sent.
    payload: Raw
    destination_ids: Annotated[list[Id], Meta(max_length=1000)] | None = None
    ordering_key: Key | None = None
    channels: Channels | None = None


class TestEventCreate(_Request):
    """A test event to one destination: `payload` (any JSON value) defaults to the
    catalog's example of the type, else {}."""

    type: EventType
    payload: Any | UnsetType = UNSET


class BatchEventCreate(_Request):
    type: EventType
    payload: Raw
    destination_ids: Annotated[list[Id], Meta(max_length=1000)] | None = None
    ordering_key: Key | None = None
    channels: Channels | None = None
    idempotency_key: Key | None = None


class EventBatch(_Request):
    events: Annotated[list[BatchEventCreate], Meta(min_length=1, max_length=MAX_BATCH_EVENTS)]


class EventAccepted(msgspec.Struct):
    id: int
    deliveries: int


class BatchAccepted(msgspec.Struct):
    data: list[EventAccepted]


class Delivery(msgspec.Struct):
    id: int
    event_id: int
    destination_id: int
    status: DeliveryStatus
    attempt: int
    next_attempt_at: Timestamp
    last_error: str | None
    created_at: Timestamp
    completed_at: Timestamp | None
    tenant: str


class Attempt(msgspec.Struct):
    attempt: int
    started_at: Timestamp
    duration_ms: int | None
    status_code: int | None
    error: str | None
    response_body: str | None


class DeliveryDetail(Delivery):
    """A delivery with its attempt history (GET /v1/deliveries/{id})."""

    attempts: list[Attempt]


class DeliveryPage(msgspec.Struct):
    data: list[Delivery]
    next: str | None


class Event(msgspec.Struct):
    id: int
    type: str
    payload: Raw
    ordering_key: str | None
    idempotency_key: str | None
    created_at: Timestamp
    deliveries: list[Delivery]
    tenant: str
    channels: list[str] | None


class ReplayDead(_Request):
    status: Literal["dead"]
    since: Annotated[
        dt.datetime, Meta(tz=True, extra_json_schema={"format": "date-time"})] | None = None


class ReplayAccepted(msgspec.Struct):
    replayed: int


class Health(msgspec.Struct):
    status: str
    database: str


class ErrorDetail(msgspec.Struct):
    code: str
    message: str


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


# The console's reads (engine/ingress/console/api.py) -----------------------------------


class EventSummary(msgspec.Struct):
    """An event in a list: without its payload, which may be large."""

    id: int
    type: str
    ordering_key: str | None
    idempotency_key: str | None
    delivery_count: int
    created_at: Timestamp
    tenant: str


class EventPage(msgspec.Struct):
    data: list[EventSummary]
    next: str | None


class DestinationStats(msgspec.Struct):
    """GET /v1/destinations/{id}/stats: attempts in the window (widened to whole minutes)
    by outcome (succeeded: 2xx; http_error: another status; transport_error: no answer),
    their duration percentiles (from a histogram: within 19 % of the exact value), the
    backlog now and the dead deliveries (since `dead_since` when given)."""

    destination_id: int
    window_s: float
    attempts: int
    succeeded: int
    http_error: int
    transport_error: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    pending: int
    in_flight: int
    dead: int
    dead_since: Timestamp | None


class MinuteCount(msgspec.Struct):
    minute: Timestamp
    succeeded: int
    failed: int


class DestinationSummary(msgspec.Struct):
    """A destination's backlog now and its attempts over the overview's window (widened to
    whole minutes; percentiles from a histogram, within 19 %)."""

    id: int
    pending: int
    in_flight: int
    attempts: int
    succeeded: int
    p50_ms: float | None
    p99_ms: float | None
    last_error: str | None
    last_error_at: Timestamp | None


class QueueDepth(msgspec.Struct):
    pending: int
    pending_due: int
    retrying: int
    in_flight: int
    expired_in_flight: int
    dead: int
    oldest_pending_age_s: float | None
    oldest_due_lag_s: float | None


class BreakerCounts(msgspec.Struct):
    closed: int
    open: int
    half_open: int
    disabled: int
    paused: int
    open_for_hours: int


class Overview(msgspec.Struct):
    """GET /v1/overview: what the console's first page shows, in one request."""

    at: Timestamp
    window_s: float
    queue: QueueDepth
    breakers: BreakerCounts
    per_minute: list[MinuteCount]
    destinations: list[DestinationSummary]
    warnings: list[str]


# Tenants and API keys (engine/ingress/tenants_api.py) ----------------------------------

TENANT_UID_PATTERN = whole("[A-Za-z0-9._:-]{1,64}")
TenantUid = Annotated[str, Meta(
    pattern=TENANT_UID_PATTERN,
    description="The operator's own id for its customer: 1-64 of A-Z a-z 0-9 . _ : -")]
TenantName = Annotated[str, Meta(min_length=1, max_length=256, pattern=_NO_NUL)]
Metadata = Annotated[dict[str, Any], Meta(description="Any JSON object, up to 4 KiB")]
Scope = Literal["send", "read", "manage"]
MAX_METADATA_BYTES = 4096


class TenantCreate(_Request):
    uid: TenantUid
    name: TenantName | None = None
    metadata: Metadata | None = None


class TenantPatch(_Request):
    name: TenantName | UnsetType | None = UNSET
    metadata: Metadata | UnsetType | None = UNSET
    disabled: bool | UnsetType = UNSET
    rate_limit: RateLimit | UnsetType | None = UNSET
    max_in_flight: MaxInFlight | UnsetType | None = UNSET


class Tenant(msgspec.Struct):
    id: int
    uid: str
    name: str | None
    metadata: dict[str, Any] | None
    disabled: bool
    max_in_flight: int | None
    rate_limit: float | None
    created_at: Timestamp
    updated_at: Timestamp
    # Its backlog now: deliveries waiting and being sent.
    pending: int
    in_flight: int


class TenantPage(msgspec.Struct):
    data: list[Tenant]
    next: str | None


class KeyCreate(_Request):
    name: TenantName
    scopes: Annotated[list[Scope], Meta(min_length=1, max_length=3)] | None = None


class ApiKey(msgspec.Struct):
    id: int
    name: str
    prefix: str
    scopes: list[str]
    created_at: Timestamp
    last_used_at: Timestamp | None
    tenant: str
    # The key itself: only in the answer to its creation, never again.
    key: str | UnsetType = UNSET


class ApiKeyList(msgspec.Struct):
    data: list[ApiKey]


# The customer portal (portal.py). A link's lifetime: 1 s to 7 days, an hour by default
# (portal_tokens.py).
class PortalLinkCreate(_Request):
    expires_in: Annotated[int, Meta(ge=1, le=7 * 86400)] | None = None
    read_only: bool = False


class PortalLink(msgspec.Struct):
    url: str
    expires_at: Timestamp
    tenant: str
    read_only: bool


class Session(msgspec.Struct):
    """Who the calling token is: the admin, a tenant's API key or a portal link."""

    kind: str  # "admin", "key" or "portal"
    tenant: str  # the tenant the unscoped paths mean for it
    scopes: list[str]
    read_only: bool
    expires_at: Timestamp | None


class PortalKeyRotated(msgspec.Struct):
    key_id: int  # the new signing key
    retired: int  # keys retired (0 before the first link, else 1)


# The event-type catalog (engine/ingress/event_types_api.py) -----------------------------

# An event type's name, as the path, the catalog and event_types' CHECK say it.
EVENT_TYPE_NAME = "[A-Za-z0-9._-]{1,128}"
EVENT_TYPE_NAME_PATTERN = whole(EVENT_TYPE_NAME)
Description = Annotated[str, Meta(max_length=4096, pattern=_NO_NUL)]
JsonSchema = Annotated[dict[str, Any], Meta(
    description="A JSON Schema (its `$schema`'s draft; Draft 2020-12 when none), at most"
                " 64 KiB as JSON; `$ref` only within it")]
Example = Annotated[Any, Meta(description="A payload of the type; it must pass the schema")]


class EventTypeCreate(_Request):
    # The name's rule is checked by the handler, so a bad name is a 422 that names it.
    name: str
    description: Description | None = None
    schema: JsonSchema | None = None
    example: Example | None = None
    deprecated: bool = False


class EventTypePatch(_Request):
    description: Description | UnsetType | None = UNSET
    schema: JsonSchema | UnsetType | None = UNSET
    example: Example | UnsetType | None = UNSET
    deprecated: bool | UnsetType = UNSET


class CatalogEventType(msgspec.Struct):
    name: str
    description: str | None
    schema: dict[str, Any] | None
    example: Any
    deprecated: bool
    created_at: Timestamp
    updated_at: Timestamp


class EventTypePage(msgspec.Struct):
    data: list[CatalogEventType]
    next: str | None

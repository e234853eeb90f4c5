"""The parameters of the engine/sql/ statements: one typed tuple for each statement that
takes any (several statements may share one).

Each field is one `$n`, in order, named as the statement's header names it ("$5 capped
destination ids bigint[]" is `capped_destination_ids`); the code binds a statement only
through its tuple, built by keyword. engine/db/queries.py says which tuple binds which file,
and tests/test_sql_headers.py compares every header with its tuple, so a parameter
reordered on one side fails a test instead of binding a value to the wrong `$n`.
"""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple


class ClaimBatchParams(NamedTuple):
    worker_id: str
    limit: int
    first_attempt_reserve: int
    lease_ms: int
    capped_destination_ids: list[int]  # what lock_capped_destinations.sql just locked
    destination_ids: list[int]  # those this worker wants none of now
    rate_limited_destination_ids: list[int]
    tokens: list[int]  # what take_rate_tokens.sql took for each of the above
    tenant_cursor: int = 0  # the fair share's walk goes on below this tenant (TenantCursor)


class TakeRateTokensParams(NamedTuple):
    limit: int
    destination_ids: list[int]  # claim_batch's destination_ids


class LockCappedDestinationsParams(NamedTuple):
    advisory_lock_class: int
    limit: int


class LockLimitedTenantsParams(NamedTuple):
    advisory_lock_class: int
    limit: int


class BookSendTimesParams(NamedTuple):
    tenant_ids: list[int]
    tenant_next_send_times: list[dt.datetime]
    destination_ids: list[int]
    destination_next_send_times: list[dt.datetime]


class ClaimLimitedTenantsParams(NamedTuple):
    worker_id: str
    limit: int
    lease_ms: int
    tenant_ids: list[int]  # what lock_limited_tenants.sql just locked
    capped_destination_ids: list[int]  # what lock_capped_destinations.sql just locked
    destination_ids: list[int]  # those this worker wants none of now


class RecordResultsParams(NamedTuple):
    worker_id: str
    results: str  # JSON
    breaker_threshold: int
    breaker_base_pause_ms: int
    breaker_max_pause_ms: int
    advisory_lock_class: int
    notification_channel: str
    refilled_destination_ids: list[int]  # refilled in the same transaction: no wake-up
    tenant_advisory_lock_class: int


class RefillSlotsParams(NamedTuple):
    worker_id: str
    lease_ms: int
    destination_ids: list[int]  # capped destinations whose slots the batch gave back
    slots: list[int]  # at most this many for each
    spares: list[int]  # and at most this many that take no slot


class ReturnClaimsParams(NamedTuple):
    locked_by: str | None
    only_expired: bool
    reason: str
    max_attempts: int
    batch_limit: int
    advisory_lock_class: int
    tenant_advisory_lock_class: int


class EnqueueEventsParams(NamedTuple):
    types: list[str]
    payloads: list[str]
    ordering_keys: list[str | None]
    idempotency_keys: list[str | None]
    request_hashes: list[bytes | None]
    explicit: list[bool]
    target_ord: list[int]
    target_destination_id: list[int]
    tenant_ids: list[int]
    channels: list[str | None]
    filterable: list[bool]
    traceparents: list[str | None]


class TenantParams(NamedTuple):
    tenant_id: int


class TenantDeliveryParams(NamedTuple):
    delivery_id: int
    tenant_id: int


class TenantDestinationParams(NamedTuple):
    destination_id: int
    tenant_id: int


class TenantEventParams(NamedTuple):
    event_id: int
    tenant_id: int


class DestinationIdsParams(NamedTuple):
    destination_ids: list[int]


class AcceptFindKeysParams(NamedTuple):
    tenant_ids: list[int]
    idempotency_keys: list[str]


class NotifyDeliveriesParams(NamedTuple):
    notification_channel: str


class LockKeyParams(NamedTuple):
    lock_key: int


class LeaderSessionTimeoutParams(NamedTuple):
    idle_session_timeout: str  # an interval, e.g. '10s'


class RetentionCutoffParams(NamedTuple):
    retention_seconds: float


class FoldDeliveryMinutesParams(NamedTuple):
    batch_limit: int


class StatusDestinationsParams(NamedTuple):
    top_n: int


class TenantTopParams(NamedTuple):
    top_n: int


class ConsoleDestinationWindowParams(NamedTuple):
    window_seconds: float


class SchemaTablesParams(NamedTuple):
    left_out: list[str]  # table names


class TableOidParams(NamedTuple):
    table_oid: int


class ReplayDeadParams(NamedTuple):
    destination_id: int
    since: object  # datetime | None
    until: object  # datetime | None
    batch_limit: int


class LockTimeoutLocalParams(NamedTuple):
    lock_timeout: str  # a PostgreSQL duration: '200ms'


class PartitionsEnsureParams(NamedTuple):
    days_ahead: int


class PartitionsDroppableParams(NamedTuple):
    cutoff: dt.datetime
    table: str


class PartitionDropParams(NamedTuple):
    partition: str


class BatchLimitParams(NamedTuple):
    batch_limit: int


class PayloadSweepParams(NamedTuple):
    lower: dt.datetime | None
    upper: dt.datetime
    after_id: int
    batch_limit: int


class PayloadSweepsReadParams(NamedTuple):
    cutoff: dt.datetime


class PayloadSweepsSaveParams(NamedTuple):
    partition: str
    after_id: int
    left_some: bool
    complete: bool


class EventPayloadDeleteParams(NamedTuple):
    event_id: int
    created_at: dt.datetime


class BreakerDeferParams(NamedTuple):
    batch_limit: int


class EndStalledClaimsParams(NamedTuple):
    stalled_after_ms: int


class AutoDisableParams(NamedTuple):
    disable_after_seconds: float


class RetentionMinutesParams(NamedTuple):
    cutoff: object  # datetime: retention_cutoff.sql's
    batch_limit: int
    kept_seconds: float


class MigrationsRecordParams(NamedTuple):
    version: int
    name: str


class DemoAttemptsParams(NamedTuple):
    destination_ids: list[int]
    limit: int


class ConsoleEventsParams(NamedTuple):
    since: object  # datetime | None
    until: object  # datetime | None
    after_id: int | None
    limit: int
    event_type: str | None
    tenant_id: int


class ConsoleDeliveriesParams(NamedTuple):
    event_type: str | None
    since: object  # datetime | None
    until: object  # datetime | None
    status: str | None
    destination_id: int | None
    after_id: int | None
    limit: int
    tenant_id: int


class ConsoleDeadDeliveriesParams(NamedTuple):
    destination_id: int | None
    before_id: int | None
    limit: int
    tenant_id: int


class DestinationStatsParams(NamedTuple):
    destination_id: int
    window_seconds: float
    dead_since: object  # datetime | None


class ApiDestinationCreateParams(NamedTuple):
    url: str
    secret: str
    event_types: list[str] | None
    max_in_flight: int | None
    ordered: bool
    timeout_ms: int
    rate_limit: float | None
    headers: str | None  # a JSON object
    retry_schedule: list[float] | None
    tenant_id: int
    filter: str | None  # a JSON object
    filter_path: str | None
    channels: list[str] | None
    tls_client_cert: str | None = None
    tls_client_key: str | None = None
    tls_ca_bundle: str | None = None
    proxy: str | None = None
    auth: str | None = None  # a JSON object
    propagate_trace: bool | None = None


class ApiDestinationPatchParams(NamedTuple):
    destination_id: int
    url: str | None
    set_event_types: bool
    event_types: list[str] | None
    set_max_in_flight: bool
    max_in_flight: int | None
    ordered: bool | None
    timeout_ms: int | None
    paused: bool | None
    disabled: bool | None
    new_secret: str | None
    previous_secret_ms: int
    resume: bool
    set_rate_limit: bool
    rate_limit: float | None
    set_headers: bool
    headers: str | None  # a JSON object
    set_retry_schedule: bool
    retry_schedule: list[float] | None
    tenant_id: int
    set_filter: bool
    filter: str | None  # a JSON object
    filter_path: str | None
    set_channels: bool
    channels: list[str] | None
    set_tls: bool = False
    tls_client_cert: str | None = None
    tls_client_key: str | None = None
    tls_ca_bundle: str | None = None
    set_proxy: bool = False
    proxy: str | None = None
    set_auth: bool = False
    auth: str | None = None  # a JSON object
    propagate_trace: bool | None = None


class ApiDeliveriesListParams(NamedTuple):
    status: str | None
    before_id: int | None
    limit: int
    scan_deliveries: bool
    scan_finished_deliveries: bool
    tenant_id: int


class ApiDestinationDeliveriesListParams(NamedTuple):
    status: str | None
    before_id: int | None
    limit: int
    scan_deliveries: bool
    scan_finished_deliveries: bool
    destination_id: int
    tenant_id: int


# Tenants and API keys (engine/sql/tenants/) ---------------------------------------------


class TenantCreateParams(NamedTuple):
    uid: str
    name: str | None
    metadata: str | None  # a JSON object


class TenantFindParams(NamedTuple):
    tenant_reference: str
    tenant_reference_id: int | None


class TenantsListParams(NamedTuple):
    after_id: int | None
    limit: int


class TenantPatchParams(NamedTuple):
    tenant_id: int
    set_name: bool
    name: str | None
    set_metadata: bool
    metadata: str | None  # a JSON object
    disabled: bool | None
    set_max_in_flight: bool
    max_in_flight: int | None
    set_rate_limit: bool
    rate_limit: float | None


class TenantPurgePendingParams(NamedTuple):
    tenant_id: int
    batch_limit: int


class KeyCreateParams(NamedTuple):
    tenant_id: int
    name: str
    prefix: str
    key_hash: bytes
    scopes: list[str]


class KeyRevokeParams(NamedTuple):
    tenant_id: int
    key_id: int


class KeysMarkUsedParams(NamedTuple):
    key_ids: list[int]
    used_at: list[object]  # datetimes


class PortalKeyParams(NamedTuple):
    secret: bytes
# The event-type catalog (engine/sql/catalog/) -------------------------------------------


class EventTypeWriteParams(NamedTuple):
    name: str
    description: str | None
    schema: str | None  # a JSON Schema as JSON text
    example: str | None  # a JSON document as text
    deprecated: bool


class EventTypeParams(NamedTuple):
    name: str


class EventTypesListParams(NamedTuple):
    after_name: str | None
    limit: int


class DestinationEgressReadParams(NamedTuple):
    destination_id: int


class OauthTokenReadParams(NamedTuple):
    destination_id: int
    egress_revision: int


class OauthTokenLockParams(NamedTuple):
    advisory_lock_class: int
    destination_id: int


class OauthTokenStoreParams(NamedTuple):
    destination_id: int
    egress_revision: int
    access_token: str
    lifetime_s: float
    refresh_after_s: float


class TableLeavesParams(NamedTuple):
    table_name: str

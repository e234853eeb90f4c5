"""Every SQL statement the engine runs: one file under engine/sql/ and one declared
parameter type (engine/db/sql_params.py), coupled once here in a `Statement` and run only
through it.

    claims = await CLAIM_BATCH.run(conn, ClaimBatchParams(worker_id=..., ...))
    RETURN_CLAIMS.run_sync(conn, ReturnClaimsParams(...)).fetchone()

A file is found by its name anywhere under engine/sql/ and read once, at import. Adding a
parameter touches the file (its header and body), its type and the call site that builds
the type; tests/test_sql_headers.py holds every header against its type, through
`STATEMENTS`. The files use PostgreSQL's own $n placeholders, so the cursors are raw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generic, TypeVar

from psycopg import AsyncConnection, AsyncRawCursor, Connection, RawCursor
from psycopg.rows import AsyncRowFactory, RowFactory

from engine.db import sql_params as p

# Ingress notifies this channel once per committed batch of events; idle delivery workers
# LISTEN on it (and poll as a fallback, since a notification can be missed while a worker
# reconnects).
NOTIFY_CHANNEL = "engine_deliveries"

SQL_DIR = Path(__file__).parents[1] / "sql"

Params = TypeVar("Params", bound=tuple)

# Every statement by name (its file's stem), filled as the statements below are made.
STATEMENTS: dict[str, Statement] = {}


class Statement(Generic[Params]):
    """One engine/sql/ file, read once, and the type its parameters are bound through
    (None: the statement takes none). `run` and `run_sync` refuse any other value, so a
    statement is never bound through a bare tuple whose order nothing checks."""

    __slots__ = ("name", "params", "sql")

    def __init__(self, name: str, params: type[Params] | None = None) -> None:
        if name in STATEMENTS:
            raise ValueError(f"statement {name} declared twice")
        self.name = name
        self.params = params
        self.sql = _find(name).read_bytes()
        STATEMENTS[name] = self

    def _bound(self, params: Params | None) -> Params | None:
        if type(params) is not (self.params or type(None)):
            wanted = self.params.__name__ if self.params else "no parameters"
            raise TypeError(f"{self.name} takes {wanted}, not {type(params).__name__}")
        return params

    async def run(
        self, conn: AsyncConnection, params: Params | None = None, *,
        row_factory: AsyncRowFactory[Any] | None = None,
    ) -> AsyncRawCursor[Any]:
        """Execute on an asyncio connection (inside its transaction or pipeline, if any);
        the cursor holds the rows (tuples, unless `row_factory` says otherwise)."""
        cursor = AsyncRawCursor(conn, row_factory=row_factory)
        await cursor.execute(self.sql, self._bound(params))
        return cursor

    def run_sync(
        self, conn: Connection, params: Params | None = None, *,
        row_factory: RowFactory[Any] | None = None,
    ) -> RawCursor[Any]:
        """`run` on a synchronous connection (the supervisor, maintenance, commands)."""
        cursor = RawCursor(conn, row_factory=row_factory)
        cursor.execute(self.sql, self._bound(params))
        return cursor

    def __repr__(self) -> str:
        return f"Statement({self.name!r})"


def _find(name: str) -> Path:
    found = list(SQL_DIR.rglob(f"{name}.sql"))
    if len(found) != 1:
        raise LookupError(f"{name}.sql: {len(found)} files under {SQL_DIR}, not one")
    return found[0]


# Claiming (engine/db/queue_async.py): the capped destinations' locks, the rate tokens, then
# the claim, in one transaction.
LOCK_CAPPED_DESTINATIONS = Statement("lock_capped_destinations", p.LockCappedDestinationsParams)
TAKE_RATE_TOKENS = Statement("take_rate_tokens", p.TakeRateTokensParams)
LOCK_LIMITED_TENANTS = Statement("lock_limited_tenants", p.LockLimitedTenantsParams)
CLAIM_LIMITED_TENANTS = Statement("claim_limited_tenants", p.ClaimLimitedTenantsParams)
BOOK_SEND_TIMES = Statement("book_send_times", p.BookSendTimesParams)
CLAIM_BATCH = Statement("claim_batch", p.ClaimBatchParams)
NOTIFY_DELIVERIES = Statement("notify_deliveries", p.NotifyDeliveriesParams)
# Results (engine/db/queue_async.py) and claims given back (engine/db/queue.py).
RECORD_RESULTS = Statement("record_results", p.RecordResultsParams)
REFILL_SLOTS = Statement("refill_slots", p.RefillSlotsParams)
RETURN_CLAIMS = Statement("return_claims", p.ReturnClaimsParams)
# The accept path (engine/ingress/committer.py, engine/db/queue_async.py).
ENQUEUE_EVENTS = Statement("enqueue_events", p.EnqueueEventsParams)
ACCEPT_FIND_DESTINATIONS = Statement("accept_find_destinations", p.DestinationIdsParams)
ACCEPT_FIND_KEYS = Statement("accept_find_keys", p.AcceptFindKeysParams)
# Replays (engine/db/queue_async.py).
REPLAY_DELIVERY = Statement("replay_delivery", p.TenantDeliveryParams)
REPLAY_DEAD = Statement("replay_dead", p.ReplayDeadParams)
EVENT_PAYLOAD_LOCK = Statement("event_payload_lock", p.TenantEventParams)
EVENT_PAYLOAD_DELETE = Statement("event_payload_delete", p.EventPayloadDeleteParams)
DATABASE_NOW = Statement("database_now")
# Maintenance (engine/maintenance/).
LEADER_SESSION_TIMEOUT = Statement("leader_session_timeout", p.LeaderSessionTimeoutParams)
LEADER_TRY_LOCK = Statement("leader_try_lock", p.LockKeyParams)
SESSION_ALIVE = Statement("session_alive")
RETENTION_CUTOFF = Statement("retention_cutoff", p.RetentionCutoffParams)
LOCK_TIMEOUT_LOCAL = Statement("lock_timeout_local", p.LockTimeoutLocalParams)
PARTITIONS_ENSURE = Statement("partitions_ensure", p.PartitionsEnsureParams)
PARTITIONS_DROPPABLE = Statement("partitions_droppable", p.PartitionsDroppableParams)
PARTITION_DROP = Statement("partition_drop", p.PartitionDropParams)
IDEMPOTENCY_KEYS_EXPIRE = Statement("idempotency_keys_expire", p.BatchLimitParams)
PAYLOAD_SWEEP_EVENTS = Statement("payload_sweep_events", p.PayloadSweepParams)
PAYLOAD_SWEEP_ATTEMPTS = Statement("payload_sweep_attempts", p.PayloadSweepParams)
PAYLOAD_SWEEPS_READ = Statement("payload_sweeps_read", p.PayloadSweepsReadParams)
PAYLOAD_SWEEPS_SAVE = Statement("payload_sweeps_save", p.PayloadSweepsSaveParams)
RETENTION_MINUTES = Statement("retention_minutes", p.RetentionMinutesParams)
FOLD_DELIVERY_MINUTES = Statement("fold_delivery_minutes", p.FoldDeliveryMinutesParams)
BREAKER_DEFER = Statement("breaker_defer", p.BreakerDeferParams)
AUTO_DISABLE = Statement("auto_disable", p.AutoDisableParams)
END_STALLED_CLAIMS = Statement("end_stalled_claims", p.EndStalledClaimsParams)
# The migrator's bookkeeping (engine/db/migrate.py) and the schema dump (engine/db/schema_dump.py).
MIGRATIONS_LOCK = Statement("migrations_lock", p.LockKeyParams)
MIGRATIONS_UNLOCK = Statement("migrations_unlock", p.LockKeyParams)
MIGRATIONS_TABLE = Statement("migrations_table")
MIGRATIONS_CURRENT = Statement("migrations_current")
MIGRATIONS_RECORD = Statement("migrations_record", p.MigrationsRecordParams)
MIGRATIONS_EXISTS = Statement("migrations_exists")
MIGRATIONS_NEWEST = Statement("migrations_newest")
SCHEMA_ENUMS = Statement("schema_enums")
SCHEMA_SEQUENCES = Statement("schema_sequences")
SCHEMA_TABLES = Statement("schema_tables", p.SchemaTablesParams)
SCHEMA_COLUMNS = Statement("schema_columns", p.TableOidParams)
SCHEMA_CONSTRAINTS = Statement("schema_constraints", p.TableOidParams)
SCHEMA_INDEXES = Statement("schema_indexes", p.TableOidParams)
# Metrics, `engine status` and autovacuum advice (engine/observe/: metrics.py, status.py,
# autovacuum_advice.py).
METRICS_GAUGES = Statement("metrics_gauges")
METRICS_TENANT_BACKLOG = Statement("metrics_tenant_backlog", p.TenantTopParams)
SCRAPE_STATEMENT_TIMEOUT = Statement("scrape_statement_timeout")
SNAPSHOT_READ_ONLY = Statement("snapshot_read_only")
RELOAD_SERVER_CONFIG = Statement("reload_server_config")
TABLE_LEAVES = Statement("table_leaves", p.TableLeavesParams)
STATUS_QUEUE = Statement("status_queue")
STATUS_FANOUT = Statement("status_fanout")
STATUS_BREAKERS = Statement("status_breakers")
STATUS_DESTINATIONS = Statement("status_destinations", p.StatusDestinationsParams)
STATUS_TENANTS = Statement("status_tenants", p.TenantTopParams)
STATUS_TABLES = Statement("status_tables")
STATUS_INDEXES = Statement("status_indexes")
STATUS_STATEMENTS = Statement("status_statements")
STATUS_SETTINGS = Statement("status_settings")
PG_STAT_STATEMENTS_INSTALLED = Statement("pg_stat_statements_installed")
# The demo's page (engine/demo/view.py).
DEMO_DESTINATIONS = Statement("demo_destinations", p.DestinationIdsParams)
DEMO_ATTEMPTS = Statement("demo_attempts", p.DemoAttemptsParams)
# The console's reads (engine/ingress/console/store.py).
CONSOLE_EVENTS = Statement("console_events", p.ConsoleEventsParams)
CONSOLE_DELIVERIES_BY_EVENT = Statement("console_deliveries_by_event", p.ConsoleDeliveriesParams)
CONSOLE_MINUTES = Statement("console_minutes")
CONSOLE_DEAD_DELIVERIES = Statement("console_dead_deliveries", p.ConsoleDeadDeliveriesParams)
CONSOLE_DESTINATION_WINDOW = Statement(
    "console_destination_window", p.ConsoleDestinationWindowParams)
DESTINATION_STATS = Statement("destination_stats", p.DestinationStatsParams)
# The API's reads and destination changes (engine/ingress/store.py).
API_DESTINATION_CREATE = Statement("api_destination_create", p.ApiDestinationCreateParams)
API_DESTINATIONS_LIST = Statement("api_destinations_list", p.TenantParams)
API_DESTINATION_READ = Statement("api_destination_read", p.TenantDestinationParams)
API_DESTINATION_PATCH = Statement("api_destination_patch", p.ApiDestinationPatchParams)
API_DESTINATION_DELETE = Statement("api_destination_delete", p.TenantDestinationParams)
API_EVENT_READ = Statement("api_event_read", p.TenantEventParams)
API_EVENT_DELIVERIES = Statement("api_event_deliveries", p.TenantEventParams)
API_DELIVERIES_LIST = Statement("api_deliveries_list", p.ApiDeliveriesListParams)
API_DESTINATION_DELIVERIES_LIST = Statement(
    "api_destination_deliveries_list", p.ApiDestinationDeliveriesListParams)
API_DELIVERY_READ = Statement("api_delivery_read", p.TenantDeliveryParams)
API_DELIVERY_ATTEMPTS = Statement("api_delivery_attempts", p.TenantDeliveryParams)

# Tenants and API keys (engine/ingress/tenants_api.py, engine/ingress/keys.py).
TENANT_CREATE = Statement("tenant_create", p.TenantCreateParams)
TENANT_FIND = Statement("tenant_find", p.TenantFindParams)
TENANT_READ = Statement("tenant_read", p.TenantParams)
TENANTS_LIST = Statement("tenants_list", p.TenantsListParams)
TENANT_PATCH = Statement("tenant_patch", p.TenantPatchParams)
TENANT_DELETE = Statement("tenant_delete", p.TenantParams)
TENANT_PURGE_PENDING = Statement("tenant_purge_pending", p.TenantPurgePendingParams)
KEY_CREATE = Statement("key_create", p.KeyCreateParams)
KEYS_LIST = Statement("keys_list", p.TenantParams)
KEY_REVOKE = Statement("key_revoke", p.KeyRevokeParams)
KEYS_LIVE = Statement("keys_live")
AUTH_GENERATION_READ = Statement("auth_generation_read")
KEYS_MARK_USED = Statement("keys_mark_used", p.KeysMarkUsedParams)

# The customer portal's signing key (engine/ingress/portal.py, engine/ingress/keys.py).
PORTAL_KEY_ENSURE = Statement("portal_key_ensure", p.PortalKeyParams)
PORTAL_KEY_ROTATE = Statement("portal_key_rotate", p.PortalKeyParams)
PORTAL_KEY_LIVE = Statement("portal_key_live")
PORTAL_TENANT_READ = Statement("portal_tenant_read", p.TenantParams)
# The event-type catalog (engine/ingress/event_types_api.py, engine/ingress/catalog.py).
EVENT_TYPE_CREATE = Statement("event_type_create", p.EventTypeWriteParams)
EVENT_TYPES_LIST = Statement("event_types_list", p.EventTypesListParams)
EVENT_TYPE_READ = Statement("event_type_read", p.EventTypeParams)
EVENT_TYPE_LOCK = Statement("event_type_lock", p.EventTypeParams)
EVENT_TYPE_UPDATE = Statement("event_type_update", p.EventTypeWriteParams)
EVENT_TYPE_DELETE = Statement("event_type_delete", p.EventTypeParams)
EVENT_TYPE_GENERATION_READ = Statement("event_type_generation_read")
EVENT_TYPES_LIVE = Statement("event_types_live")
# Egress: a destination's settings and its OAuth2 token (engine/worker/egress.py).
DESTINATION_EGRESS_READ = Statement("destination_egress_read", p.DestinationEgressReadParams)
OAUTH_TOKEN_READ = Statement("oauth_token_read", p.OauthTokenReadParams)
OAUTH_TOKEN_LOCK = Statement("oauth_token_lock", p.OauthTokenLockParams)
OAUTH_TOKEN_STORE = Statement("oauth_token_store", p.OauthTokenStoreParams)

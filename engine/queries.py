"""Every SQL statement the engine runs, each in its own file under engine/sql/, read once at
import (engine/sql_params.py: the parameters of those bound through a typed tuple)."""

from __future__ import annotations

from pathlib import Path

# Ingress runs `NOTIFY engine_deliveries` once per committed batch of events; idle delivery
# workers LISTEN on it (and poll as a fallback, since a notification can be missed while
# a worker reconnects).
NOTIFY_CHANNEL = "engine_deliveries"

_SQL_DIR = Path(__file__).with_name("sql")


def _load(name: str) -> bytes:
    return (_SQL_DIR / f"{name}.sql").read_bytes()


CLAIM_BATCH = _load("claim_batch")
LOCK_CAPPED_DESTINATIONS = _load("lock_capped_destinations")
TAKE_RATE_TOKENS = _load("take_rate_tokens")
RECORD_RESULTS = _load("record_results")
REFILL_SLOTS = _load("refill_slots")
RETURN_CLAIMS = _load("return_claims")
REPLAY_DELIVERY = _load("replay_delivery")
REPLAY_DEAD = _load("replay_dead")
ENQUEUE_EVENTS = _load("enqueue_events")
# The accept path's reads around enqueue_events (engine/ingress/committer.py).
ACCEPT_FIND_DESTINATIONS = _load("accept_find_destinations")
ACCEPT_FIND_KEYS = _load("accept_find_keys")
METRICS_GAUGES = _load("metrics_gauges")
RETENTION_FINISHED = _load("retention_finished")
RETENTION_EVENTS = _load("retention_events")
RETENTION_CUTOFF = _load("retention_cutoff")
DATABASE_NOW = _load("database_now")
SESSION_ALIVE = _load("session_alive")
SNAPSHOT_READ_ONLY = _load("snapshot_read_only")
SCRAPE_STATEMENT_TIMEOUT = _load("scrape_statement_timeout")
RELOAD_SERVER_CONFIG = _load("reload_server_config")
# The maintenance leader lock (engine/maintenance/leader.py) and the migrator's bookkeeping
# (engine/migrate.py).
LEADER_SESSION_TIMEOUT = _load("leader_session_timeout")
LEADER_TRY_LOCK = _load("leader_try_lock")
MIGRATIONS_LOCK = _load("migrations_lock")
MIGRATIONS_UNLOCK = _load("migrations_unlock")
MIGRATIONS_TABLE = _load("migrations_table")
MIGRATIONS_CURRENT = _load("migrations_current")
MIGRATIONS_RECORD = _load("migrations_record")
MIGRATIONS_EXISTS = _load("migrations_exists")
MIGRATIONS_NEWEST = _load("migrations_newest")
RETENTION_MINUTES = _load("retention_minutes")
FOLD_DELIVERY_MINUTES = _load("fold_delivery_minutes")
STATUS_QUEUE = _load("status_queue")
STATUS_FANOUT = _load("status_fanout")
STATUS_BREAKERS = _load("status_breakers")
STATUS_DESTINATIONS = _load("status_destinations")
STATUS_TABLES = _load("status_tables")
STATUS_INDEXES = _load("status_indexes")
STATUS_STATEMENTS = _load("status_statements")
STATUS_SETTINGS = _load("status_settings")
PG_STAT_STATEMENTS_INSTALLED = _load("pg_stat_statements_installed")
BREAKER_DEFER = _load("breaker_defer")
AUTO_DISABLE = _load("auto_disable")
END_STALLED_CLAIMS = _load("end_stalled_claims")
DEMO_DESTINATIONS = _load("demo_destinations")
DEMO_ATTEMPTS = _load("demo_attempts")
# The console's reads (engine/ingress/console_store.py).
CONSOLE_EVENTS = _load("console_events")
CONSOLE_DELIVERIES_BY_EVENT = _load("console_deliveries_by_event")
CONSOLE_MINUTES = _load("console_minutes")
CONSOLE_DEAD_DELIVERIES = _load("console_dead_deliveries")
CONSOLE_DESTINATION_WINDOW = _load("console_destination_window")
DESTINATION_STATS = _load("destination_stats")
# The API's reads and destination changes (engine/ingress/store.py).
API_DESTINATION_CREATE = _load("api_destination_create")
API_DESTINATIONS_LIST = _load("api_destinations_list")
API_DESTINATION_READ = _load("api_destination_read")
API_DESTINATION_PATCH = _load("api_destination_patch")
API_DESTINATION_DELETE = _load("api_destination_delete")
API_EVENT_READ = _load("api_event_read")
API_EVENT_DELIVERIES = _load("api_event_deliveries")
API_DELIVERIES_LIST = _load("api_deliveries_list")
API_DESTINATION_DELIVERIES_LIST = _load("api_destination_deliveries_list")
API_DELIVERY_READ = _load("api_delivery_read")
API_DELIVERY_ATTEMPTS = _load("api_delivery_attempts")

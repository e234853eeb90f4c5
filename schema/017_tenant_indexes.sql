-- engine: no transaction
-- The indexes that scope the big tables by tenant (issue 39, docs/decisions/0026). Built
-- CONCURRENTLY, each in its own statement outside a transaction (engine/db/migrate.py runs
-- a file headed `-- engine: no transaction` statement by statement in autocommit): the
-- running engine keeps writing events and finishing deliveries while they are built. A
-- build cut short leaves an invalid index behind, so each is dropped first: the file is
-- only run again when it was not recorded as applied.
--
-- Each new index replaces one that read across tenants, dropped once its successor is
-- built, so a write maintains as many indexes as before:
-- finished_deliveries_tenant_idx: a tenant's deliveries newest first (GET deliveries).
-- finished_deliveries_tenant_dead_idx: a tenant's dead deliveries newest first (replaces
--   finished_deliveries_dead_all_idx).
-- events_tenant_created_idx: a tenant's events newest first (replaces events_created_id_idx).
-- events_tenant_type_created_idx: a tenant's events of one type newest first (replaces
--   events_type_created_idx).
-- events_tenant_idempotency_idx: an Idempotency-Key is one tenant's: another tenant using
--   the same key is another request, and must not learn the key exists (409). Replaces
--   events_idempotency_key_idx, dropped last. While that index stood, a tenant reusing
--   another's key was refused by it (a unique violation): the refusal told it the key
--   exists. Dropping it ends the ingress of an engine from before tenants still running
--   (its inserts name ON CONFLICT (idempotency_key), which needs that index): such a host
--   refuses events from here until it is restarted on this version, as the README's
--   upgrade steps say; its workers keep delivering (016's trigger files what they write).
--   Isolation between tenants is the property kept (docs/decisions/0028).
DROP INDEX CONCURRENTLY IF EXISTS finished_deliveries_tenant_idx;
CREATE INDEX CONCURRENTLY finished_deliveries_tenant_idx ON finished_deliveries (tenant_id, id);
DROP INDEX CONCURRENTLY IF EXISTS finished_deliveries_tenant_dead_idx;
CREATE INDEX CONCURRENTLY finished_deliveries_tenant_dead_idx ON finished_deliveries (tenant_id, id)
    WHERE status = 'dead';
DROP INDEX CONCURRENTLY IF EXISTS finished_deliveries_dead_all_idx;
DROP INDEX CONCURRENTLY IF EXISTS events_tenant_created_idx;
CREATE INDEX CONCURRENTLY events_tenant_created_idx ON events (tenant_id, created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS events_created_id_idx;
DROP INDEX CONCURRENTLY IF EXISTS events_tenant_type_created_idx;
CREATE INDEX CONCURRENTLY events_tenant_type_created_idx ON events (tenant_id, type, created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS events_type_created_idx;
DROP INDEX CONCURRENTLY IF EXISTS events_tenant_idempotency_idx;
CREATE UNIQUE INDEX CONCURRENTLY events_tenant_idempotency_idx ON events (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS events_idempotency_key_idx;

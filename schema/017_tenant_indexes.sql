-- engine: no transaction
-- The indexes that scope the big tables by tenant (issue 39, docs/decisions/0026). Built
-- CONCURRENTLY, each in its own statement outside a transaction (engine/db/migrate.py runs
-- a file headed `-- engine: no transaction` statement by statement in autocommit): the
-- running engine keeps writing events and finishing deliveries while they are built. A
-- build cut short leaves an invalid index behind, so each is dropped first: the file is
-- only run again when it was not recorded as applied.
--
-- finished_deliveries_tenant_idx: a tenant's deliveries newest first (GET deliveries).
-- events_tenant_created_idx: a tenant's events newest first (GET events).
-- events_tenant_idempotency_idx: an Idempotency-Key is one tenant's: another tenant using
-- the same key is another request, and must not learn the key exists (409). It replaces
-- events_idempotency_key_idx, which stays for now: the engine from before tenants, still
-- running until its host is restarted, inserts events with ON CONFLICT (idempotency_key),
-- and without a unique index on that column alone every one of its inserts fails, whatever
-- the key ("no unique or exclusion constraint matching the ON CONFLICT specification").
-- It is dropped by a later step, once no engine from before tenants can be running
-- (docs/decisions/0027).
DROP INDEX CONCURRENTLY IF EXISTS finished_deliveries_tenant_idx;
CREATE INDEX CONCURRENTLY finished_deliveries_tenant_idx ON finished_deliveries (tenant_id, id);
DROP INDEX CONCURRENTLY IF EXISTS events_tenant_created_idx;
CREATE INDEX CONCURRENTLY events_tenant_created_idx ON events (tenant_id, created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS events_tenant_idempotency_idx;
CREATE UNIQUE INDEX CONCURRENTLY events_tenant_idempotency_idx ON events (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

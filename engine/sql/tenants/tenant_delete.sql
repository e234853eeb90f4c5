-- tenant_delete: DELETE /v1/tenants/{tenant}, the part done at once: the tenant is marked
-- deleted (its uid free again), its keys revoked (auth_generation moves, so every ingress
-- process drops them within a refresh) and its destinations deleted, so nothing of it is
-- sent or accepted from here on. Its pending deliveries go afterwards in bounded batches
-- (tenant_purge_pending.sql); its history stays until retention.
--   $1 tenant id bigint
WITH gone AS (
    UPDATE tenants SET deleted_at = now(), updated_at = now()
     WHERE id = $1::bigint AND deleted_at IS NULL
 RETURNING id
), keys_revoked AS (
    UPDATE api_keys SET revoked_at = now()
     WHERE tenant_id IN (SELECT id FROM gone) AND revoked_at IS NULL
), destinations_deleted AS (
    UPDATE destinations SET deleted_at = now(), updated_at = now()
     WHERE tenant_id IN (SELECT id FROM gone) AND deleted_at IS NULL
), moved AS (
    UPDATE auth_generation SET generation = generation + 1
     WHERE EXISTS (SELECT 1 FROM gone)
)
SELECT id FROM gone

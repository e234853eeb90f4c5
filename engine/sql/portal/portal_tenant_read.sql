-- portal_tenant_read: the tenant a portal token names (by id), when the token is first
-- seen after auth_generation moved: the ingress process keeps the answer until the next
-- move (engine/ingress/keys.py), since deleting or disabling a tenant moves it.
--   $1 tenant id bigint
-- Returns uid, disabled; no row for a deleted tenant.
SELECT uid, disabled FROM tenants WHERE id = $1::bigint AND deleted_at IS NULL

-- keys_list: GET /v1/tenants/{tenant}/keys: the tenant's keys not revoked, oldest first.
-- last_used_at is written by the ingress processes every few seconds, not per request
-- (keys_mark_used.sql).
--   $1 tenant id bigint
-- Returns the key columns in the order engine/ingress/tenants_api.py `_key` reads them
-- (the same list in every key*.sql).
SELECT id, name, prefix, scopes, created_at, last_used_at
  FROM api_keys
 WHERE tenant_id = $1::bigint AND revoked_at IS NULL
 ORDER BY id

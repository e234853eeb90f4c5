-- key_revoke: DELETE /v1/tenants/{tenant}/keys/{id}: the key is refused from the next
-- refresh of every ingress process on (auth_generation moves; engine/ingress/keys.py).
-- No row when the tenant has no such live key.
--   $1 tenant id bigint, $2 key id bigint
WITH revoked AS (
    UPDATE api_keys SET revoked_at = now()
     WHERE id = $2::bigint AND tenant_id = $1::bigint AND revoked_at IS NULL
 RETURNING id
), moved AS (
    UPDATE auth_generation SET generation = generation + 1
     WHERE EXISTS (SELECT 1 FROM revoked)
)
SELECT id FROM revoked

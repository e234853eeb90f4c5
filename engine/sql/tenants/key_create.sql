-- key_create: POST /v1/tenants/{tenant}/keys: store a new key's hash (the key itself is
-- shown once, never stored) and move auth_generation so every ingress process knows it.
-- No row when the tenant is not live.
--   $1 tenant id bigint, $2 name text, $3 prefix text (the key's first characters, shown
--   in lists), $4 key hash bytea (SHA-256 of the key), $5 scopes text[]
-- Returns the key columns in the order engine/ingress/tenants_api.py `_key` reads them
-- (the same list in every key*.sql).
WITH inserted AS (
    INSERT INTO api_keys (tenant_id, name, prefix, key_hash, scopes)
    SELECT $1::bigint, $2::text, $3::text, $4::bytea, $5::text[]
      FROM tenants WHERE id = $1::bigint AND deleted_at IS NULL
 RETURNING id, name, prefix, scopes, created_at, last_used_at
), moved AS (
    UPDATE auth_generation SET generation = generation + 1
     WHERE EXISTS (SELECT 1 FROM inserted)
)
SELECT id, name, prefix, scopes, created_at, last_used_at FROM inserted

-- tenant_find: the live tenant a path's {tenant} names, for the admin token (a tenant
-- key's own tenant is known without asking: engine/ingress/keys.py). A uid matches first;
-- only when no live tenant has it as its uid may an all-digit value name an id.
--   $1 tenant reference text (the path segment),
--   $2 tenant reference id bigint (the same as a number; NULL when not all digits)
SELECT id, uid
  FROM tenants
 WHERE deleted_at IS NULL AND (uid = $1::text OR id = $2::bigint)
 ORDER BY uid = $1::text DESC
 LIMIT 1

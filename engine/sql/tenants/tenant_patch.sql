-- tenant_patch: PATCH /v1/tenants/{tenant}. A NULL value, or a false `set_*` flag for a
-- nullable column, keeps the column. Disabling or enabling moves auth_generation: every
-- ingress process reloads its keys (a disabled tenant's keys are refused).
--   $1 tenant id bigint, $2 set name bool, $3 name text, $4 set metadata bool,
--   $5 metadata text (a JSON object), $6 disabled bool (NULL: keep),
--   $7 set max_in_flight bool, $8 max_in_flight int, $9 set rate_limit bool,
--   $10 rate_limit float8
-- Returns the tenant columns in the order engine/ingress/tenants_api.py `_tenant` reads
-- them (the same list in every tenant_*.sql).
WITH changed AS (
    UPDATE tenants SET
        name = CASE WHEN $2::bool THEN $3::text ELSE name END,
        metadata = CASE WHEN $4::bool THEN $5::text::jsonb ELSE metadata END,
        disabled = coalesce($6::bool, disabled),
        max_in_flight = CASE WHEN $7::bool THEN $8::int ELSE max_in_flight END,
        rate_limit = CASE WHEN $9::bool THEN $10::float8 ELSE rate_limit END,
        updated_at = now()
     WHERE id = $1::bigint AND deleted_at IS NULL
 RETURNING *
), moved AS (
    UPDATE auth_generation SET generation = generation + 1
     WHERE $6::bool IS NOT NULL AND EXISTS (SELECT 1 FROM changed)
)
SELECT t.id, t.uid, t.name, t.metadata, t.disabled, t.max_in_flight, t.rate_limit,
       t.created_at, t.updated_at,
       (SELECT count(*) FROM deliveries d WHERE d.tenant_id = t.id AND d.status = 'pending'),
       (SELECT count(*) FROM deliveries d WHERE d.tenant_id = t.id AND d.status = 'in_flight')
  FROM changed t

-- tenant_create: POST /v1/tenants (engine/ingress/tenants_api.py). No row when a live
-- tenant has the uid already (tenants_uid_idx): the handler answers 409.
--   $1 uid text, $2 name text (NULL: none), $3 metadata text (a JSON object, or NULL)
-- Returns the tenant columns in the order engine/ingress/tenants_api.py `_tenant` reads
-- them (the same list in every tenant_*.sql), its backlog zero.
INSERT INTO tenants (uid, name, metadata)
VALUES ($1::text, $2::text, $3::text::jsonb)
    ON CONFLICT (uid) WHERE deleted_at IS NULL DO NOTHING
RETURNING id, uid, name, metadata, disabled, max_in_flight, rate_limit, created_at,
          updated_at, 0::bigint, 0::bigint

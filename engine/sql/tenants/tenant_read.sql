-- tenant_read: GET /v1/tenants/{tenant}, with its backlog.
--   $1 tenant id bigint
-- Returns the tenant columns in the order engine/ingress/tenants_api.py `_tenant` reads
-- them (the same list in every tenant_*.sql). The backlog counts its rows in the hot
-- table, which holds only the backlog.
SELECT t.id, t.uid, t.name, t.metadata, t.disabled, t.max_in_flight, t.rate_limit,
       t.created_at, t.updated_at,
       (SELECT count(*) FROM deliveries d WHERE d.tenant_id = t.id AND d.status = 'pending'),
       (SELECT count(*) FROM deliveries d WHERE d.tenant_id = t.id AND d.status = 'in_flight')
  FROM tenants t
 WHERE t.id = $1::bigint AND t.deleted_at IS NULL

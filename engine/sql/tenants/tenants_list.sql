-- tenants_list: GET /v1/tenants, live tenants by id, keyset paging, each with its backlog.
--   $1 after id bigint (the cursor; NULL: first page), $2 limit int
-- Returns the tenant columns in the order engine/ingress/tenants_api.py `_tenant` reads
-- them (the same list in every tenant_*.sql). The backlog of the page's tenants only.
SELECT t.id, t.uid, t.name, t.metadata, t.disabled, t.max_in_flight, t.rate_limit,
       t.created_at, t.updated_at,
       (SELECT count(*) FROM deliveries d WHERE d.tenant_id = t.id AND d.status = 'pending'),
       (SELECT count(*) FROM deliveries d WHERE d.tenant_id = t.id AND d.status = 'in_flight')
  FROM tenants t
 WHERE t.deleted_at IS NULL AND t.id > coalesce($1::bigint, 0)
 ORDER BY t.id
 LIMIT $2::int

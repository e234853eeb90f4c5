-- accept_find_keys: the first answers of events whose Idempotency-Key enqueue_events.sql
-- found already used, so a repeated request gets the same answer (or a conflict when its
-- request hash differs; engine/ingress/committer.py). A key is one tenant's: matched as
-- (tenant, key) pairs (events_tenant_idempotency_idx).
--   $1 tenant ids bigint[], $2 idempotency keys text[] (pairs, position by position)
SELECT e.tenant_id, e.idempotency_key, e.id, e.delivery_count, e.request_hash
  FROM unnest($1::bigint[], $2::text[]) AS k(tenant_id, idempotency_key)
  JOIN events e ON e.tenant_id = k.tenant_id AND e.idempotency_key = k.idempotency_key

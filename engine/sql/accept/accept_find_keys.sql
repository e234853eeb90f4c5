-- accept_find_keys: the first answers of events whose Idempotency-Key enqueue_events.sql
-- found already used, so a repeated request gets the same answer (or a conflict when its
-- request hash differs; engine/ingress/committer.py). A key is one tenant's: matched as
-- (tenant, key) pairs, in idempotency_keys (its primary key; schema/025), which holds the
-- first answer itself: the partitioned events table is not read.
--   $1 tenant ids bigint[], $2 idempotency keys text[] (pairs, position by position)
SELECT k.tenant_id, k.idempotency_key, k.event_id, k.delivery_count, k.request_hash
  FROM unnest($1::bigint[], $2::text[]) AS w(tenant_id, idempotency_key)
  JOIN idempotency_keys k ON k.tenant_id = w.tenant_id AND k.idempotency_key = w.idempotency_key

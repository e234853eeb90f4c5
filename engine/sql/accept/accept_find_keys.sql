-- accept_find_keys: the first answers of events whose Idempotency-Key enqueue_events.sql
-- found already used, so a repeated request gets the same answer (or a conflict when its
-- request hash differs; engine/ingress/committer.py).
--   $1 idempotency keys text[]
SELECT idempotency_key, id, delivery_count, request_hash FROM events
 WHERE idempotency_key = ANY($1)

-- idempotency_keys_expire: delete one bounded batch of idempotency keys whose event is
-- gone with its partition: created before the lower bound of the oldest events partition
-- left (none while the legacy partition, from MINVALUE, is there). A key lives as long
-- as its event.
--   $1 batch limit int
WITH oldest AS (
    SELECT CASE WHEN bool_or(h.lower IS NULL) THEN NULL ELSE min(h.lower) END AS since
      FROM history_partitions() h
     WHERE h.parent = 'events' AND NOT h.is_default
), old AS (
    SELECT k.tenant_id, k.idempotency_key
      FROM idempotency_keys k
     WHERE k.event_created_at < (SELECT since FROM oldest)
     ORDER BY k.event_created_at
     LIMIT $1::int
       FOR UPDATE SKIP LOCKED
)
DELETE FROM idempotency_keys k
 USING old
 WHERE k.tenant_id = old.tenant_id AND k.idempotency_key = old.idempotency_key

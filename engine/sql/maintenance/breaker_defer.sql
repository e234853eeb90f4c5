-- breaker_defer: move one bounded batch of due deliveries of destinations whose breaker is
-- open to the end of their pause (maintenance leader, every few seconds).
--   $1 batch limit int
-- Why: the claim reads deliveries_claimable_idx in next_attempt_at order and filters out
-- paused destinations row by row. A destination that has been down for an hour would
-- leave an hour of its traffic at the head of that index, and every claim would walk
-- past all of it before reaching a healthy row. Moved to paused_until, those rows are out
-- of the way and fall due exactly when the probe may run. Only `open`, never
-- `half_open`: a half-open pause is the probe's lease, and a recovered destination must
-- not wait for it. Rows keep their order (ordered destinations are ordered by id).
WITH paused AS (
    SELECT id, paused_until
      FROM destinations
     WHERE breaker = 'open' AND paused_until > now() + interval '1 second'
       AND deleted_at IS NULL
), batch AS (
    SELECT d.id, p.paused_until
      FROM paused p
      JOIN deliveries d ON d.destination_id = p.id
     WHERE d.status = 'pending' AND d.next_attempt_at < p.paused_until
     LIMIT $1
       FOR UPDATE OF d SKIP LOCKED
)
UPDATE deliveries d
   SET next_attempt_at = b.paused_until
  FROM batch b
 WHERE d.id = b.id

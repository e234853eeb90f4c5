-- replay_delivery: send one delivery again, through the claim path, as a first attempt.
--   $1 delivery id bigint
-- A finished delivery (dead or delivered) moves back into the queue (requeue_finished,
-- schema/014); a pending one (a retry waiting for its time) becomes due now. An
-- in-flight one is left alone.
WITH requeued AS (
    SELECT requeue_finished(ARRAY[$1::bigint]) AS id
), made_due AS (
    UPDATE deliveries SET attempt = 0, next_attempt_at = now()
     WHERE id = $1 AND status = 'pending'
 RETURNING id
)
SELECT id FROM requeued UNION ALL SELECT id FROM made_due

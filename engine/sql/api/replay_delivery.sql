-- replay_delivery: send one delivery again, through the claim path, as a first attempt.
--   $1 delivery id bigint, $2 tenant id bigint (another tenant's delivery is left alone)
-- A finished delivery (dead or delivered) moves back into the queue (requeue_finished,
-- schema/014); a pending one (a retry waiting for its time) becomes due now. An
-- in-flight one is left alone.
WITH requeued AS (
    SELECT requeue_finished(ARRAY(
           SELECT id FROM finished_deliveries WHERE id = $1::bigint AND tenant_id = $2::bigint
           )) AS id
), made_due AS (
    UPDATE deliveries SET attempt = 0, next_attempt_at = now()
     WHERE id = $1 AND tenant_id = $2::bigint AND status = 'pending'
 RETURNING id
)
SELECT id FROM requeued UNION ALL SELECT id FROM made_due

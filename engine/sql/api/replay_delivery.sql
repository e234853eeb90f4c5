-- replay_delivery: send one delivery again, through the claim path, as a first attempt.
--   $1 delivery id bigint, $2 tenant id bigint (another tenant's delivery is left alone)
-- A finished delivery (dead or delivered) moves back into the queue (requeue_finished,
-- schema/014); a pending one (a retry waiting for its time) becomes due now. An
-- in-flight one is left alone, and so is a finished one whose event's payload was removed
-- (payload retention, DELETE /v1/events/{id}/payload): there is nothing to send. The event
-- is locked FOR SHARE, so a removal running meanwhile either waits for this replay and
-- then sees its delivery queued (event_payload_lock.sql), or is seen here as done.
WITH requeued AS (
    SELECT requeue_finished(ARRAY(
           SELECT f.id
             FROM finished_deliveries f
             JOIN events e ON e.id = f.event_id AND e.created_at = f.created_at
            WHERE f.id = $1::bigint AND f.tenant_id = $2::bigint
              AND e.payload IS NOT NULL
              FOR SHARE OF e
           )) AS id
), made_due AS (
    UPDATE deliveries SET attempt = 0, next_attempt_at = now()
     WHERE id = $1 AND tenant_id = $2::bigint AND status = 'pending'
 RETURNING id
)
SELECT id FROM requeued UNION ALL SELECT id FROM made_due

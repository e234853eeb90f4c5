-- replay_delivery: send one delivery again, through the claim path, as a first attempt.
--   $1 delivery id bigint
-- A finished delivery (dead or delivered) moves back into the queue; a pending one (a
-- retry waiting for its time) becomes due now. An in-flight one is left alone.
WITH moved AS (
    DELETE FROM finished_deliveries WHERE id = $1 RETURNING *
), requeued AS (
    INSERT INTO deliveries
           (id, event_id, destination_id, status, attempt, next_attempt_at,
            ordering_key, last_error, created_at)
    SELECT id, event_id, destination_id, 'pending', 0, now(), ordering_key, last_error,
           created_at
      FROM moved
 RETURNING id
), made_due AS (
    UPDATE deliveries SET attempt = 0, next_attempt_at = now()
     WHERE id = $1 AND status = 'pending'
 RETURNING id
)
SELECT id FROM requeued UNION ALL SELECT id FROM made_due

-- replay_dead: move one bounded batch of a destination's dead deliveries back into the
-- queue as first attempts (requeue_finished, schema/014). The caller loops until a batch
-- comes back short; each batch is its own short transaction, never one giant one.
--   $1 destination_id bigint, $2 since timestamptz (NULL: any age),
--   $3 until timestamptz (when the replay began: what dies again meanwhile is not
--      replayed again by the same request), $4 batch limit int
-- A delivery whose event's payload was removed is not replayed (replay_delivery.sql).
WITH batch AS (
    SELECT f.id
      FROM finished_deliveries f
      JOIN events e ON e.id = f.event_id AND e.created_at = f.created_at
     WHERE f.destination_id = $1 AND f.status = 'dead'
       AND f.completed_at >= coalesce($2, '-infinity'::timestamptz)
       AND f.completed_at <= $3
       AND e.payload IS NOT NULL
     ORDER BY f.completed_at
     LIMIT $4
       FOR UPDATE OF f SKIP LOCKED
       FOR SHARE OF e SKIP LOCKED
)
SELECT count(*) FROM requeue_finished(ARRAY(SELECT id FROM batch))

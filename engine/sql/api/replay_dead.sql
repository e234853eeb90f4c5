-- replay_dead: move one bounded batch of a destination's dead deliveries back into the
-- queue as first attempts (requeue_finished, schema/014). The caller loops until a batch
-- comes back short; each batch is its own short transaction, never one giant one.
--   $1 destination_id bigint, $2 since timestamptz (NULL: any age),
--   $3 until timestamptz (when the replay began: what dies again meanwhile is not
--      replayed again by the same request), $4 batch limit int
WITH batch AS (
    SELECT id
      FROM finished_deliveries
     WHERE destination_id = $1 AND status = 'dead'
       AND completed_at >= coalesce($2, '-infinity'::timestamptz)
       AND completed_at <= $3
     ORDER BY completed_at
     LIMIT $4
       FOR UPDATE SKIP LOCKED
)
SELECT count(*) FROM requeue_finished(ARRAY(SELECT id FROM batch))

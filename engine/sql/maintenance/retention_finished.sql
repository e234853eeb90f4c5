-- retention_finished: delete one bounded batch of finished deliveries completed before a
-- cutoff, with their attempt history. The caller loops, one short transaction per batch.
--   $1 cutoff timestamptz, $2 batch limit int
-- finished_deliveries_completed_idx (BRIN) finds the old block ranges; SKIP LOCKED leaves
-- rows a replay is moving back to the queue to that replay.
WITH old AS (
    SELECT id
      FROM finished_deliveries
     WHERE completed_at < $1
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), attempts AS (
    DELETE FROM delivery_attempts a
     USING old
     WHERE a.delivery_id = old.id
 RETURNING 1
), removed AS (
    DELETE FROM finished_deliveries f
     USING old
     WHERE f.id = old.id
 RETURNING 1
)
SELECT (SELECT count(*) FROM removed), (SELECT count(*) FROM attempts)

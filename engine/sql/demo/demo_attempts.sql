-- demo_attempts: the newest HTTP attempts to an `engine demo` run's destinations, for its
-- live view. An attempt row names only its delivery, which lives in either table.
--   $1 destination ids bigint[], $2 limit int (how many attempts, newest first)
SELECT a.started_at, owner.destination_id, a.delivery_id, a.attempt, a.status_code,
       a.duration_ms, a.error
  FROM delivery_attempts a
  CROSS JOIN LATERAL (
        SELECT destination_id FROM deliveries WHERE id = a.delivery_id
        UNION ALL
        SELECT destination_id FROM finished_deliveries WHERE id = a.delivery_id
        LIMIT 1
       ) owner
 WHERE owner.destination_id = ANY($1::bigint[])
 ORDER BY a.id DESC
 LIMIT $2::int

-- demo_destinations: one row per destination of an `engine demo` run for its live view:
-- breaker and state, and its deliveries by outcome. A demo's tables hold one short run's
-- traffic, so plain counts over both tables are fine; not a statement for production.
--   $1 destination ids bigint[]
SELECT d.id, d.breaker::text, d.disabled, d.paused_until, d.consecutive_failures,
       coalesce(hot.first_attempts, 0), coalesce(hot.retrying, 0),
       coalesce(hot.in_flight, 0), coalesce(done.delivered, 0), coalesce(done.dead, 0)
  FROM destinations d
  LEFT JOIN (
        SELECT destination_id,
               count(*) FILTER (WHERE status = 'pending' AND attempt = 0) AS first_attempts,
               count(*) FILTER (WHERE status = 'pending' AND attempt > 0) AS retrying,
               count(*) FILTER (WHERE status = 'in_flight') AS in_flight
          FROM deliveries
         WHERE destination_id = ANY($1::bigint[])
         GROUP BY destination_id
       ) hot ON hot.destination_id = d.id
  LEFT JOIN (
        SELECT destination_id,
               count(*) FILTER (WHERE status = 'delivered') AS delivered,
               count(*) FILTER (WHERE status = 'dead') AS dead
          FROM finished_deliveries
         WHERE destination_id = ANY($1::bigint[])
         GROUP BY destination_id
       ) done ON done.destination_id = d.id
 WHERE d.id = ANY($1::bigint[])
 ORDER BY d.id

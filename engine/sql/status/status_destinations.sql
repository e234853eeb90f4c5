-- status_destinations: the destinations with the largest backlog, with breaker state.
--   $1 top N int
-- Backlog counts: destination_backlog (schema/014), through deliveries_destination_idx.
SELECT dest.id, dest.url, coalesce(b.pending, 0) AS pending,
       coalesce(b.in_flight, 0) AS in_flight, dest.breaker::text,
       dest.consecutive_failures, dest.paused_until, dest.breaker_opened_at,
       extract(epoch FROM now() - dest.breaker_opened_at)::float8 AS open_for_s,
       dest.disabled, dest.paused, dest.max_in_flight
  FROM destinations dest
  LEFT JOIN destination_backlog b ON b.destination_id = dest.id
 WHERE dest.deleted_at IS NULL
   AND (b.destination_id IS NOT NULL OR dest.breaker <> 'closed' OR dest.disabled
        OR dest.paused)
 ORDER BY coalesce(b.pending, 0) + coalesce(b.in_flight, 0) DESC, dest.id
 LIMIT $1

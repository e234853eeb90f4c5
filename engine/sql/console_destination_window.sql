-- console_destination_window: per destination, its backlog now and its attempts in the
-- window: how many, how many succeeded (2xx), their duration histogram with its extremes
-- (console_store.py computes p50/p99 from them, engine/duration_histogram.py), the
-- latest error.
--   $1 window seconds float8
-- The window is widened to whole minutes: every minute it overlaps counts.
-- Attempts come from the per-minute rollup (delivery_minutes, schema/011) through its
-- primary key (minute first): one row per minute and destination, whatever the delivery
-- rate. The backlog is a GROUP BY over the hot table, which holds only the backlog. So
-- the cost is the window's minutes plus the queue, never the history.
WITH window_stats AS (
    SELECT destination_id,
           sum(succeeded + http_error + transport_error) AS attempts,
           sum(succeeded) AS succeeded,
           duration_histogram_sum(durations) AS durations,
           min(min_ms) AS min_ms, max(max_ms) AS max_ms,
           (array_agg(last_error ORDER BY last_error_at DESC)
                FILTER (WHERE last_error_at IS NOT NULL))[1] AS last_error,
           max(last_error_at) AS last_error_at
      FROM delivery_minutes
     WHERE minute > now() - $1::float8 * interval '1 second' - interval '1 minute'
     GROUP BY destination_id
), backlog AS (
    SELECT destination_id,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'in_flight') AS in_flight
      FROM deliveries
     GROUP BY destination_id
)
SELECT dest.id, coalesce(b.pending, 0) AS pending, coalesce(b.in_flight, 0) AS in_flight,
       coalesce(w.attempts, 0)::bigint AS attempts, coalesce(w.succeeded, 0)::bigint AS succeeded,
       w.durations, w.min_ms, w.max_ms, w.last_error, w.last_error_at
  FROM destinations dest
  LEFT JOIN backlog b ON b.destination_id = dest.id
  LEFT JOIN window_stats w ON w.destination_id = dest.id
 WHERE dest.deleted_at IS NULL
 ORDER BY dest.id

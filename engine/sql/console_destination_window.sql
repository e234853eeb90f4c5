-- console_destination_window: per destination, its backlog now and its attempts in the
-- window: how many, how many succeeded (2xx), duration p50/p99, the latest error.
--   $1 window seconds float8
-- Attempts come from delivery_attempts_started_idx (BRIN: the window's blocks only), each
-- naming its destination; the backlog is a GROUP BY over the hot table, which holds only
-- the backlog. So the cost is the window's attempts plus the queue, never the history.
WITH recent AS (
    SELECT destination_id, started_at, duration_ms, status_code, error
      FROM delivery_attempts
     WHERE started_at >= now() - $1::float8 * interval '1 second'
), window_stats AS (
    SELECT destination_id,
           count(*) AS attempts,
           count(*) FILTER (WHERE status_code BETWEEN 200 AND 299) AS succeeded,
           -- One sort for both percentiles.
           percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY duration_ms) AS pct
      FROM recent
     WHERE destination_id IS NOT NULL
     GROUP BY destination_id
), last_errors AS (
    -- Only the failed attempts are sorted, not the whole window.
    SELECT DISTINCT ON (destination_id) destination_id, error, started_at
      FROM recent
     WHERE destination_id IS NOT NULL AND error IS NOT NULL
     ORDER BY destination_id, started_at DESC
), backlog AS (
    SELECT destination_id,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'in_flight') AS in_flight
      FROM deliveries
     GROUP BY destination_id
)
SELECT dest.id, coalesce(b.pending, 0) AS pending, coalesce(b.in_flight, 0) AS in_flight,
       coalesce(w.attempts, 0) AS attempts, coalesce(w.succeeded, 0) AS succeeded,
       w.pct[1] AS p50_ms, w.pct[2] AS p99_ms, e.error AS last_error,
       e.started_at AS last_error_at
  FROM destinations dest
  LEFT JOIN backlog b ON b.destination_id = dest.id
  LEFT JOIN window_stats w ON w.destination_id = dest.id
  LEFT JOIN last_errors e ON e.destination_id = dest.id
 WHERE dest.deleted_at IS NULL
 ORDER BY dest.id

-- console_destination_window: per destination, its backlog now and its attempts in the
-- window: how many, how many succeeded (2xx), their duration histogram with its extremes
-- (engine/ingress/console/store.py computes p50/p99 from them, engine/observe/duration_histogram.py), the
-- latest error.
--   $1 window seconds float8
-- Attempts come from destination_window() (schema/014): the per-minute rollup through its
-- primary key (minute first), one row per minute and destination, whatever the delivery
-- rate. The backlog is destination_backlog (schema/014), over the hot table, which holds
-- only the backlog. So the cost is the window's minutes plus the queue, never the history.
SELECT dest.id, coalesce(b.pending, 0) AS pending, coalesce(b.in_flight, 0) AS in_flight,
       coalesce(w.succeeded + w.http_error + w.transport_error, 0) AS attempts,
       coalesce(w.succeeded, 0) AS succeeded,
       w.durations, w.min_ms, w.max_ms, w.last_error, w.last_error_at
  FROM destinations dest
  LEFT JOIN destination_backlog b ON b.destination_id = dest.id
  LEFT JOIN destination_window($1::float8) w ON w.destination_id = dest.id
 WHERE dest.deleted_at IS NULL
 ORDER BY dest.id

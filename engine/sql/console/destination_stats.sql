-- destination_stats: GET /v1/destinations/{id}/stats: one destination's attempts in the
-- window by outcome, their duration histogram with its extremes (engine/ingress/console/store.py
-- computes p50/p90/p99 from them, engine/observe/duration_histogram.py), its backlog and its
-- dead deliveries.
--   $1 destination id bigint, $2 window seconds float8,
--   $3 dead since timestamptz (NULL: count every dead delivery)
-- Its attempts come from destination_window() (schema/014), the per-minute rollup read
-- through delivery_minutes_destination_idx: at most 1,440 rows for 24 hours. The backlog
-- comes through deliveries_destination_idx; the dead count is an index-only range of
-- finished_deliveries_dead_idx. Nothing scans the history. Outcomes: succeeded (2xx),
-- http_error (any other status: the destination answered), transport_error (no answer:
-- timeout, refused, DNS, or a lost attempt).
SELECT coalesce(w.succeeded + w.http_error + w.transport_error, 0) AS attempts,
       coalesce(w.succeeded, 0) AS succeeded,
       coalesce(w.http_error, 0) AS http_error,
       coalesce(w.transport_error, 0) AS transport_error,
       w.durations, w.min_ms, w.max_ms,
       (SELECT count(*) FROM deliveries
         WHERE destination_id = $1::bigint AND status = 'pending') AS pending,
       (SELECT count(*) FROM deliveries
         WHERE destination_id = $1::bigint AND status = 'in_flight') AS in_flight,
       (SELECT count(*) FROM finished_deliveries
         WHERE destination_id = $1::bigint AND status = 'dead'
           AND completed_at >= coalesce($3::timestamptz, '-infinity')) AS dead
  FROM (SELECT) AS one
  LEFT JOIN destination_window($2::float8) w ON w.destination_id = $1::bigint

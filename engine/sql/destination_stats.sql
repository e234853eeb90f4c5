-- destination_stats: GET /v1/destinations/{id}/stats: one destination's attempts in the
-- window by outcome, their duration histogram with its extremes (console_store.py
-- computes p50/p90/p99 from them, engine/duration_histogram.py), its backlog and its
-- dead deliveries.
--   $1 destination id bigint, $2 window seconds float8,
--   $3 dead since timestamptz (NULL: count every dead delivery)
-- The window is widened to whole minutes: every minute it overlaps counts. Its attempts
-- are read from the per-minute rollup (delivery_minutes, schema/011) through
-- delivery_minutes_destination_idx: at most 1,440 rows for 24 hours, where reading the
-- attempts themselves cost ~450 ms for a day at 10 a second. The backlog comes through
-- deliveries_destination_idx; the dead count is an index-only range of
-- finished_deliveries_dead_idx. Nothing scans the history. Outcomes: succeeded (2xx),
-- http_error (any other status: the destination answered), transport_error (no answer:
-- timeout, refused, DNS, or a lost attempt).
WITH recent AS (
    SELECT succeeded, http_error, transport_error, durations, min_ms, max_ms
      FROM delivery_minutes
     WHERE destination_id = $1::bigint
       AND minute > now() - $2::float8 * interval '1 second' - interval '1 minute'
)
SELECT coalesce(sum(succeeded + http_error + transport_error), 0)::bigint AS attempts,
       coalesce(sum(succeeded), 0)::bigint AS succeeded,
       coalesce(sum(http_error), 0)::bigint AS http_error,
       coalesce(sum(transport_error), 0)::bigint AS transport_error,
       duration_histogram_sum(durations) AS durations, min(min_ms) AS min_ms,
       max(max_ms) AS max_ms,
       (SELECT count(*) FROM deliveries
         WHERE destination_id = $1::bigint AND status = 'pending') AS pending,
       (SELECT count(*) FROM deliveries
         WHERE destination_id = $1::bigint AND status = 'in_flight') AS in_flight,
       (SELECT count(*) FROM finished_deliveries
         WHERE destination_id = $1::bigint AND status = 'dead'
           AND completed_at >= coalesce($3::timestamptz, '-infinity')) AS dead
  FROM recent

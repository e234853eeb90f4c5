-- destination_stats: GET /v1/destinations/{id}/stats: one destination's attempts in the
-- window by outcome, their duration percentiles, its backlog and its dead deliveries.
--   $1 destination id bigint, $2 window seconds float8,
--   $3 dead since timestamptz (NULL: count every dead delivery)
-- The window's attempts are read through delivery_attempts_started_idx (BRIN) and
-- filtered on the destination they name; the backlog comes through
-- deliveries_destination_idx; the dead count is an index-only range of
-- finished_deliveries_dead_idx. Nothing scans the history. Outcomes: succeeded (2xx),
-- http_error (any other status: the destination answered), transport_error (no answer:
-- timeout, refused, DNS, or a lost attempt).
WITH recent AS (
    SELECT duration_ms, status_code
      FROM delivery_attempts
     WHERE started_at >= now() - $2::float8 * interval '1 second'
       AND destination_id = $1::bigint
)
SELECT count(*) AS attempts,
       count(*) FILTER (WHERE status_code BETWEEN 200 AND 299) AS succeeded,
       count(*) FILTER (WHERE status_code IS NOT NULL AND status_code NOT BETWEEN 200 AND 299)
           AS http_error,
       count(*) FILTER (WHERE status_code IS NULL) AS transport_error,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms) AS p50_ms,
       percentile_cont(0.9) WITHIN GROUP (ORDER BY duration_ms) AS p90_ms,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ms) AS p99_ms,
       (SELECT count(*) FROM deliveries
         WHERE destination_id = $1::bigint AND status = 'pending') AS pending,
       (SELECT count(*) FROM deliveries
         WHERE destination_id = $1::bigint AND status = 'in_flight') AS in_flight,
       (SELECT count(*) FROM finished_deliveries
         WHERE destination_id = $1::bigint AND status = 'dead'
           AND completed_at >= coalesce($3::timestamptz, '-infinity')) AS dead
  FROM recent

-- tenant_backlog_due: the tenants' pending deliveries all fall due at one moment, $1
-- seconds from now (clock_timestamp(), evaluated once: the fill before took seconds, and
-- a time per row would make the backlog fall due a little at a time). Returns that
-- moment as unix ms and how many deliveries it moved.
--   $1 seconds float8, $2 tenant ids bigint[]
WITH due AS (
    SELECT clock_timestamp() + make_interval(secs => $1::float8) AS at
), moved AS (
    UPDATE deliveries d SET next_attempt_at = due.at
      FROM due
     WHERE d.tenant_id = ANY ($2::bigint[]) AND d.status = 'pending'
    RETURNING 1
)
SELECT (extract(epoch FROM due.at) * 1000)::bigint, (SELECT count(*) FROM moved) FROM due

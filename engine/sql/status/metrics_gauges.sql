-- metrics_gauges: the database-derived gauges of /metrics, computed at scrape time.
-- Rows of (metric, label, value). Cheap enough to run on every scrape: the hot table holds
-- only the backlog, the counts are index-only scans of deliveries_destination_idx, and the
-- oldest due delivery is two short range scans of deliveries_claimable_idx.
SELECT 'depth', status::text, count(*)::float8
  FROM deliveries
 GROUP BY status
UNION ALL
SELECT 'oldest_due_age', '',
       coalesce(extract(epoch FROM now() - least(
           (SELECT min(next_attempt_at) FROM deliveries
             WHERE status = 'pending' AND least(attempt, 1) = 0 AND next_attempt_at <= now()),
           (SELECT min(next_attempt_at) FROM deliveries
             WHERE status = 'pending' AND least(attempt, 1) = 1 AND next_attempt_at <= now())
       )), 0)::float8
UNION ALL
SELECT 'breaker', breaker::text, count(*)::float8
  FROM destinations
 WHERE deleted_at IS NULL
 GROUP BY breaker
UNION ALL
SELECT 'dead_tuples', relname::text, n_dead_tup::float8
  FROM pg_stat_user_tables
 WHERE schemaname = current_schema()

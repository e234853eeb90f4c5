-- partitions_ensure: create the daily partitions of events, finished_deliveries and
-- delivery_attempts up to some days ahead (ensure_history_partitions(), schema/026);
-- returns how many were created. Run after lock_timeout_local.sql in one transaction.
--   $1 days ahead int
SELECT ensure_history_partitions(now() + make_interval(days => $1::int))

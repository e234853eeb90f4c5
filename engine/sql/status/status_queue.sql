-- status_queue: the queue's depth at a glance, one row: `engine status` and the console's
-- overview (refreshed every few seconds). No parameters. The fan-out averages, which read
-- a day of events, are status_fanout.sql's, which the console reads at most every few
-- minutes (engine/ingress/console/store.py).
-- Counts over the hot table are cheap (it holds only the backlog); the dead count is an
-- index-only scan of finished_deliveries_dead_idx.
SELECT
    (SELECT count(*) FROM deliveries WHERE status = 'pending') AS pending,
    (SELECT count(*) FROM deliveries WHERE status = 'pending' AND next_attempt_at <= now())
        AS pending_due,
    (SELECT count(*) FROM deliveries WHERE status = 'pending' AND attempt > 0) AS retrying,
    (SELECT count(*) FROM deliveries WHERE status = 'in_flight') AS in_flight,
    (SELECT count(*) FROM deliveries WHERE status = 'in_flight' AND locked_until < now())
        AS expired_in_flight,
    (SELECT count(*) FROM finished_deliveries WHERE status = 'dead') AS dead,
    (SELECT extract(epoch FROM now() - min(created_at))::float8
       FROM deliveries WHERE status = 'pending') AS oldest_pending_age_s,
    (SELECT extract(epoch FROM now() - min(next_attempt_at))::float8
       FROM deliveries WHERE status = 'pending' AND next_attempt_at <= now())
        AS oldest_due_lag_s

-- status_queue: the queue at a glance (engine status). One row.
-- Counts over the hot table are cheap (it holds only the backlog); the dead count is an
-- index-only scan of finished_deliveries_dead_idx; fan-out compares the deliveries per
-- event of the last hour with the 24 hours before it (events_created_at_idx, BRIN).
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
        AS oldest_due_lag_s,
    (SELECT avg(delivery_count)::float8 FROM events
      WHERE created_at >= now() - interval '1 hour') AS fanout_last_hour,
    (SELECT avg(delivery_count)::float8 FROM events
      WHERE created_at >= now() - interval '25 hours'
        AND created_at < now() - interval '1 hour') AS fanout_day_before

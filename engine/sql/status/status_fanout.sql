-- status_fanout: deliveries per event, the last hour against the 24 hours before it
-- (engine status; the console's overview at most every few minutes, engine/ingress/console/store.py).
-- No parameters. A range of events_created_at_idx (BRIN) over a day of events.
SELECT
    (SELECT avg(delivery_count)::float8 FROM events
      WHERE created_at >= now() - interval '1 hour') AS fanout_last_hour,
    (SELECT avg(delivery_count)::float8 FROM events
      WHERE created_at >= now() - interval '25 hours'
        AND created_at < now() - interval '1 hour') AS fanout_day_before

-- console_minutes: attempts per minute over the last hour, succeeded (2xx) and failed
-- (any other status, a transport error or a lost attempt), oldest minute first; every
-- one of the 60 minutes is present, zeros included. No parameters.
-- Read from the per-minute rollup (delivery_minutes, schema/011) through its primary key
-- (minute first): about one row per minute and destination (a few more per worker for
-- the last minutes, until fold_delivery_minutes.sql folds them), whatever the delivery
-- rate, where counting the attempts themselves read the hour's attempts (~250 ms at 10
-- a second).
WITH counted AS (
    SELECT minute, sum(succeeded) AS succeeded, sum(http_error + transport_error) AS failed
      FROM delivery_minutes
     WHERE minute >= date_trunc('minute', now()) - interval '59 minutes'
     GROUP BY minute
)
SELECT m.minute, coalesce(c.succeeded, 0)::bigint AS succeeded,
       coalesce(c.failed, 0)::bigint AS failed
  FROM generate_series(date_trunc('minute', now()) - interval '59 minutes',
                       date_trunc('minute', now()), interval '1 minute') AS m(minute)
  LEFT JOIN counted c ON c.minute = m.minute
 ORDER BY m.minute

-- console_minutes: attempts per minute over the last hour, succeeded (2xx) and failed
-- (any other status, a transport error or a lost attempt), oldest minute first; every
-- one of the 60 minutes is present, zeros included. No parameters.
-- Read through delivery_attempts_started_idx (BRIN on started_at: attempts are appended
-- in time order), so the cost is the last hour's attempts, never the whole history.
WITH counted AS (
    SELECT date_trunc('minute', started_at) AS minute,
           count(*) FILTER (WHERE status_code BETWEEN 200 AND 299) AS succeeded,
           count(*) FILTER (WHERE status_code IS NULL OR status_code NOT BETWEEN 200 AND 299)
               AS failed
      FROM delivery_attempts
     WHERE started_at >= date_trunc('minute', now()) - interval '59 minutes'
     GROUP BY 1
)
SELECT m.minute, coalesce(c.succeeded, 0) AS succeeded, coalesce(c.failed, 0) AS failed
  FROM generate_series(date_trunc('minute', now()) - interval '59 minutes',
                       date_trunc('minute', now()), interval '1 minute') AS m(minute)
  LEFT JOIN counted c ON c.minute = m.minute
 ORDER BY m.minute

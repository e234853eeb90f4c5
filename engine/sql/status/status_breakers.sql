-- status_breakers: destination counts by state (all of them, not only the top N).
SELECT count(*) FILTER (WHERE breaker = 'closed') AS closed,
       count(*) FILTER (WHERE breaker = 'open') AS open,
       count(*) FILTER (WHERE breaker = 'half_open') AS half_open,
       count(*) FILTER (WHERE disabled) AS disabled,
       count(*) FILTER (WHERE paused) AS paused,
       count(*) FILTER (WHERE breaker <> 'closed'
                          AND breaker_opened_at < now() - interval '1 hour') AS open_for_hours
  FROM destinations
 WHERE deleted_at IS NULL

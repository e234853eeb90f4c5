-- backlog: deliveries not yet finished (pending or in flight) and the newest event id, for
-- the throughput steps' backlog growth and which events a step posted.
--   no parameters
SELECT (SELECT count(*) FROM deliveries) AS backlog,
       (SELECT coalesce(max(id), 0) FROM events) AS last_event_id

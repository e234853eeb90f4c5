-- status_tenants: the tenants with the largest backlogs (pending + in flight), for
-- `engine status`: whom the queue is working for, and how long the oldest due delivery of
-- each has waited past its due time (NULL: nothing of it is due).
--   $1 top N int
-- One pass over the hot table (it holds only the backlog), grouped by each delivery's own
-- tenant, as status_queue.sql counts it; a tenant with no backlog is not listed.
SELECT t.id, t.uid, b.pending, b.in_flight,
       extract(epoch FROM now() - b.oldest_due)::float8 AS oldest_due_age_s
  FROM (SELECT tenant_id,
               count(*) FILTER (WHERE status = 'pending') AS pending,
               count(*) FILTER (WHERE status = 'in_flight') AS in_flight,
               min(next_attempt_at) FILTER (WHERE status = 'pending'
                                              AND next_attempt_at <= now()) AS oldest_due
          FROM deliveries
         GROUP BY tenant_id) AS b
  JOIN tenants t ON t.id = b.tenant_id
 ORDER BY b.pending + b.in_flight DESC, t.id
 LIMIT $1

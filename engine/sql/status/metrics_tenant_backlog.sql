-- metrics_tenant_backlog: /metrics' backlog by tenant, bounded: the $1 tenants with the
-- largest backlogs (pending + in flight) one row each, every other tenant summed into one
-- row whose uid is NULL (engine/observe/metrics.py labels it `other`). A series per tenant
-- would grow with the tenants (10,000 and more), each kept by Prometheus for as long as it
-- retains data; N + 1 series per status is what a scrape can afford.
--   $1 top N int
-- One pass over the hot table (it holds only the backlog), as metrics_gauges.sql's depth.
WITH per_tenant AS (
    SELECT tenant_id,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'in_flight') AS in_flight
      FROM deliveries
     GROUP BY tenant_id
), ranked AS (
    SELECT p.*, row_number() OVER (ORDER BY p.pending + p.in_flight DESC, p.tenant_id)
                AS place
      FROM per_tenant p
)
SELECT CASE WHEN r.place <= $1 THEN t.uid END AS uid,
       sum(r.pending)::float8 AS pending, sum(r.in_flight)::float8 AS in_flight
  FROM ranked r
  LEFT JOIN tenants t ON t.id = r.tenant_id
 GROUP BY CASE WHEN r.place <= $1 THEN r.tenant_id END, 1

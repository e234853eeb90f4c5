-- fill_backlog: top the queue up to $1 pending deliveries, one event each, spread over the
-- bench's destinations, due now. One statement, so a contention cell starts from the
-- same backlog whatever the previous cell consumed.
--   $1 target pending deliveries int, $2 destination ids bigint[], $3 payload text
WITH missing AS (
    SELECT greatest(0, $1 - (SELECT count(*) FROM deliveries WHERE status = 'pending'))::int
           AS n
), new_events AS (
    INSERT INTO events (type, payload, delivery_count)
    SELECT 'order.created', $3, 1 FROM missing, generate_series(1, missing.n)
    RETURNING id
)
INSERT INTO deliveries (event_id, destination_id, tenant_id)
SELECT id, ($2::bigint[])[1 + id % cardinality($2::bigint[])], 1 FROM new_events

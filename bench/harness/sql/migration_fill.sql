-- migration_fill: $1 events delivered long ago, each with its finished delivery, as a
-- database of a running engine holds them (the tenant-migration scenario's history). Ids of
-- finished deliveries come from the queue's sequence, as record_results.sql moves them.
-- Written against the schema before tenants (schema/015): no tenant_id.
--   $1 events int, $2 destination ids bigint[], $3 payload text
WITH written AS (
    INSERT INTO events (type, payload, delivery_count, created_at)
    SELECT 'order.created', $3, 1, now() - interval '2 days' + g * interval '10 ms'
      FROM generate_series(1, $1) AS g
    RETURNING id, created_at
)
INSERT INTO finished_deliveries
       (id, event_id, destination_id, status, attempt, next_attempt_at, created_at,
        completed_at)
SELECT nextval('delivery_id_seq'), id, ($2::bigint[])[1 + id % cardinality($2::bigint[])],
       'delivered', 1, created_at, created_at, created_at + interval '40 ms'
  FROM written

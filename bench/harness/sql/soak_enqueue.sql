-- soak_enqueue: events $3 + 1 .. $3 + $1, each to $5 consecutive destinations of $2 (event
-- i to $2[(i + k) % n], k < $5), written as ingress writes them: the event and its
-- deliveries in one statement, so both take the same now() as created_at (the claim finds
-- an event by (id, created_at) from schema/026 on). Written against the columns schema/024
-- and schema/026 share: bloat --history loads both engines' databases with it.
--   $1 events int, $2 destination ids bigint[], $3 events before bigint, $4 payload text,
--   $5 deliveries per event int
WITH written AS (
    INSERT INTO events (type, payload, delivery_count)
    SELECT 'order.created', $4, $5::int
      FROM generate_series(1, $1::int) AS g
    RETURNING id, created_at
), numbered AS (
    SELECT id, created_at, $3::bigint + row_number() OVER (ORDER BY id) AS i FROM written
)
INSERT INTO deliveries (event_id, destination_id, tenant_id, created_at)
SELECT n.id, ($2::bigint[])[1 + (n.i + k) % cardinality($2::bigint[])], 1, n.created_at
  FROM numbered n, generate_series(0, $5::int - 1) AS k

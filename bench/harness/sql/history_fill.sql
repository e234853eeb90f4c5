-- history_fill: $1 events delivered long ago, one every $5 from $4 on, each with $6
-- finished deliveries (to consecutive destinations of $2) and their attempts (one, or two
-- for every other delivery: a failure then a success), as a running engine leaves its
-- history; ids grow with time, as the engine's do. Written against the columns schema/024
-- and schema/026 share: the bloat scenario's history variants seed both with it.
--   $1 events int, $2 destination ids bigint[], $3 payload text, $4 first time timestamptz,
--   $5 step interval, $6 deliveries per event int
WITH written AS (
    INSERT INTO events (type, payload, delivery_count, created_at)
    SELECT 'order.created', $3, $6::int, $4::timestamptz + (g - 1) * $5::interval
      FROM generate_series(1, $1::int) AS g
     ORDER BY g
    RETURNING id, created_at
), finished AS (
    INSERT INTO finished_deliveries (id, event_id, destination_id, status, attempt,
                                     next_attempt_at, created_at, completed_at, tenant_id)
    SELECT nextval('delivery_id_seq'), w.id,
           ($2::bigint[])[1 + (w.id + k) % cardinality($2::bigint[])], 'delivered',
           1 + (w.id + k) % 2, w.created_at, w.created_at,
           w.created_at + interval '40 ms', 1
      FROM written w, generate_series(0, $6::int - 1) AS k
    RETURNING id, destination_id, attempt, completed_at
)
INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code,
                               response_body, destination_id)
SELECT f.id, a, f.completed_at - interval '35 ms' * (f.attempt - a + 1), 35,
       CASE WHEN a < f.attempt THEN 500 ELSE 200 END, 'ok', f.destination_id
  FROM finished f, generate_series(1, f.attempt) AS a

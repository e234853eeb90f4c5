-- partition_migration_fill: $1 events delivered long ago, each with its finished delivery
-- and its one attempt, as the database of a running engine at schema/024 holds them (the
-- partition-migration scenario's history). Every tenth event has an idempotency key, so
-- that 025's backfill of idempotency_keys has rows to copy. Times spread evenly over the
-- 36 hours ending 12 hours ago (this chunk's rows are $4 + 1 .. $4 + $1 of $5); ids of
-- finished deliveries come from the queue's sequence, as record_results.sql moves them.
--   $1 events int, $2 destination ids bigint[], $3 payload text, $4 rows before bigint,
--   $5 all rows bigint
WITH written AS (
    INSERT INTO events (type, payload, idempotency_key, request_hash, delivery_count,
                        created_at)
    SELECT 'order.created', $3,
           CASE WHEN ($4::bigint + g) % 10 = 0 THEN 'history-' || ($4::bigint + g) END,
           CASE WHEN ($4::bigint + g) % 10 = 0 THEN '\x01'::bytea END, 1,
           now() - interval '48 hours' + ($4::bigint + g) * (interval '36 hours' / $5::float8)
      FROM generate_series(1, $1::int) AS g
    RETURNING id, created_at
), finished AS (
    INSERT INTO finished_deliveries (id, event_id, destination_id, status, attempt,
                                     next_attempt_at, created_at, completed_at, tenant_id)
    SELECT nextval('delivery_id_seq'), id,
           ($2::bigint[])[1 + id % cardinality($2::bigint[])], 'delivered', 1, created_at,
           created_at, created_at + interval '40 ms', 1
      FROM written
    RETURNING id, destination_id, completed_at
)
INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code,
                               response_body, destination_id)
SELECT id, 1, completed_at - interval '35 ms', 35, 200, 'ok', destination_id
  FROM finished

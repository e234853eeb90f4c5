-- api_delivery_read: one delivery, queued or finished (api_delivery_attempts.sql: its
-- attempts).
--   $1 delivery id bigint
-- Returns the delivery columns engine/ingress/schemas.py `Delivery` takes, then completed_at
-- (NULL in the hot table); the same list in every api_*deliver*.sql.
SELECT
       id, event_id, destination_id, status::text, attempt, next_attempt_at, last_error,
       created_at, NULL::timestamptz
  FROM deliveries WHERE id = $1::bigint
 UNION ALL
SELECT
       id, event_id, destination_id, status::text, attempt, next_attempt_at, last_error,
       created_at, completed_at
  FROM finished_deliveries WHERE id = $1::bigint

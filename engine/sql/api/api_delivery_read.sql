-- api_delivery_read: one delivery, queued or finished (api_delivery_attempts.sql: its
-- attempts).
--   $1 delivery id bigint, $2 tenant id bigint (another tenant's: no row)
-- Returns the delivery columns engine/ingress/schemas.py `Delivery` takes, then completed_at:
-- delivery_rows (schema/014), through each table's primary key.
SELECT id, event_id, destination_id, status, attempt, next_attempt_at, last_error,
       created_at, completed_at
  FROM delivery_rows
 WHERE id = $1::bigint AND tenant_id = $2::bigint

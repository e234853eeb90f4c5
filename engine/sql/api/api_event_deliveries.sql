-- api_event_deliveries: an event's deliveries, queued and finished.
--   $1 event id bigint, $2 tenant id bigint
-- Returns the delivery columns engine/ingress/schemas.py `Delivery` takes, then completed_at:
-- delivery_rows (schema/014), through each table's event_id index.
SELECT id, event_id, destination_id, status, attempt, next_attempt_at, last_error,
       created_at, completed_at
  FROM delivery_rows
 WHERE event_id = $1::bigint AND tenant_id = $2::bigint
 ORDER BY id

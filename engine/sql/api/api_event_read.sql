-- api_event_read: GET /v1/events/{id}, the event itself (api_event_deliveries.sql: its
-- deliveries).
--   $1 event id bigint, $2 tenant id bigint (another tenant's: no row)
SELECT id, type, payload, ordering_key, idempotency_key, created_at, channels
  FROM events WHERE id = $1::bigint AND tenant_id = $2::bigint

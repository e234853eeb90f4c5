-- api_delivery_attempts: a delivery's attempt history, oldest first.
--   $1 delivery id bigint, $2 tenant id bigint (another tenant's delivery has none)
SELECT attempt, started_at, duration_ms, status_code, error, response_body
  FROM delivery_attempts
 WHERE delivery_id = $1::bigint
   AND EXISTS (SELECT 1 FROM delivery_rows WHERE id = $1::bigint AND tenant_id = $2::bigint)
 ORDER BY id

-- api_delivery_attempts: a delivery's attempt history, oldest first.
--   $1 delivery id bigint
SELECT attempt, started_at, duration_ms, status_code, error, response_body
  FROM delivery_attempts WHERE delivery_id = $1::bigint ORDER BY id

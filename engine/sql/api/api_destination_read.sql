-- api_destination_read: GET /v1/destinations/{id}.
--   $1 destination id bigint, $2 tenant id bigint (another tenant's: no row)
-- Returns the destination columns in the order engine/ingress/store.py `_destination` reads
-- them (the same list in every api_destination*.sql).
SELECT
    id, url, event_types, max_in_flight, ordered, timeout_ms, paused, disabled,
    disabled_reason, paused_until, breaker::text, consecutive_failures, created_at,
    updated_at, rate_limit, headers, retry_schedule, failing_since, secret,
    previous_secret_until, filter, channels, tls_client_cert, tls_client_key IS NOT NULL,
    tls_ca_bundle, proxy, auth - 'client_secret', propagate_trace
  FROM destinations WHERE id = $1::bigint AND tenant_id = $2::bigint AND deleted_at IS NULL

-- api_destinations_list: GET /v1/destinations, the tenant's destinations not deleted
-- (destinations_tenant_idx).
--   $1 tenant id bigint
-- Returns the destination columns in the order engine/ingress/store.py `_destination` reads
-- them (the same list in every api_destination*.sql).
SELECT
    id, url, event_types, max_in_flight, ordered, timeout_ms, paused, disabled,
    disabled_reason, paused_until, breaker::text, consecutive_failures, created_at,
    updated_at, rate_limit, headers, retry_schedule, failing_since, secret,
    previous_secret_until, filter, channels, tls_client_cert, tls_client_key IS NOT NULL,
    tls_ca_bundle, proxy, auth - 'client_secret', propagate_trace
  FROM destinations WHERE tenant_id = $1::bigint AND deleted_at IS NULL ORDER BY id

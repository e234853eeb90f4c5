-- api_destination_create: POST /v1/destinations (engine/ingress/store.py).
--   $1 url text, $2 secret text, $3 event types text[] (NULL: every type),
--   $4 max_in_flight int (NULL: no cap), $5 ordered bool, $6 timeout_ms int,
--   $7 rate_limit float8 (NULL: none), $8 headers text (a JSON object, or NULL),
--   $9 retry_schedule float8[] (seconds; NULL: the engine's), $10 tenant id bigint,
--   $11 filter text (a JSON object, or NULL), $12 filter path text (its jsonpath,
--   engine/webhooks/routing.py), $13 channels text[] (NULL: none),
--   $14 tls_client_cert text, $15 tls_client_key text, $16 tls_ca_bundle text (PEM),
--   $17 proxy text, $18 auth text (a JSON object; engine/webhooks/egress.py checked all
--   five; NULL: none), $19 propagate_trace bool (send `traceparent` on its POSTs;
--   NULL: false, docs/decisions/0035)
-- egress_revision: a new one when any of $14-$18 is set (schema/023_egress.sql).
-- Returns the destination columns in the order engine/ingress/store.py `_destination` reads
-- them (the same list in every api_destination*.sql).
INSERT INTO destinations (url, secret, event_types, max_in_flight, ordered, timeout_ms,
                          rate_limit, headers, retry_schedule, tenant_id, filter,
                          filter_path, channels, tls_client_cert, tls_client_key,
                          tls_ca_bundle, proxy, auth, egress_revision, propagate_trace)
VALUES ($1::text, $2::text, $3::text[], $4::int, $5::bool, $6::int, $7::float8,
        $8::text::jsonb, $9::float8[], $10::bigint, $11::text::jsonb, $12::text::jsonpath,
        $13::text[], $14::text, $15::text, $16::text, $17::text, $18::text::jsonb,
        CASE WHEN $14::text IS NULL AND $16::text IS NULL AND $17::text IS NULL
                  AND $18::text IS NULL THEN NULL
             ELSE nextval('egress_revision_seq') END, coalesce($19::bool, false))
RETURNING
    id, url, event_types, max_in_flight, ordered, timeout_ms, paused, disabled,
    disabled_reason, paused_until, breaker::text, consecutive_failures, created_at,
    updated_at, rate_limit, headers, retry_schedule, failing_since, secret,
    previous_secret_until, filter, channels, tls_client_cert, tls_client_key IS NOT NULL,
    tls_ca_bundle, proxy, auth - 'client_secret', propagate_trace

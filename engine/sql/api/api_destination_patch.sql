-- api_destination_patch: PATCH /v1/destinations/{id}.
--   $1 destination id bigint, $2 url text (NULL: keep),
--   $3 set event_types bool, $4 event types text[],
--   $5 set max_in_flight bool, $6 max_in_flight int,
--   $7 ordered bool (NULL: keep), $8 timeout_ms int (NULL: keep),
--   $9 paused bool (NULL: keep), $10 disabled bool (NULL: keep),
--   $11 new secret text (NULL: keep),
--   $12 previous secret ms bigint (how long the replaced secret stays valid),
--   $13 resume bool (paused or disabled set to false),
--   $14 set rate_limit bool, $15 rate_limit float8, $16 set headers bool,
--   $17 headers text (a JSON object), $18 set retry_schedule bool,
--   $19 retry_schedule float8[] ($14-$19: from store.DeliveryOptions), $20 tenant id bigint,
--   $21 set filter bool, $22 filter text (a JSON object, or NULL),
--   $23 filter path text (its jsonpath, engine/webhooks/routing.py),
--   $24 set channels bool, $25 channels text[],
--   $26 set tls bool, $27 tls_client_cert text, $28 tls_client_key text,
--   $29 tls_ca_bundle text, $30 set proxy bool, $31 proxy text, $32 set auth bool,
--   $33 auth text (a JSON object) ($26-$33: from store.EgressSettings),
--   $34 propagate_trace bool (NULL: keep)
-- A change of tls, proxy or auth takes a new egress_revision (NULL when none is left), so
-- workers read the destination's egress settings again and no token fetched with the old
-- credentials is used (schema/023_egress.sql).
-- Every field is optional: a NULL value (or a false `set_*` flag for nullable columns)
-- keeps the column. Resuming (paused or disabled set to false) also closes the breaker,
-- so the operator's "go" is not held back by an old failure streak, and restarts the
-- auto-disable clock (failing_since). Right-hand sides see the old row, so
-- `previous_secret = secret` keeps the secret being replaced.
-- Returns the destination columns in the order engine/ingress/store.py `_destination` reads
-- them (the same list in every api_destination*.sql).
UPDATE destinations SET
    url = coalesce($2::text, url),
    event_types = CASE WHEN $3::bool THEN $4::text[] ELSE event_types END,
    max_in_flight = CASE WHEN $5::bool THEN $6::int ELSE max_in_flight END,
    ordered = coalesce($7::bool, ordered),
    timeout_ms = coalesce($8::int, timeout_ms),
    paused = coalesce($9::bool, paused),
    disabled = coalesce($10::bool, disabled),
    disabled_reason = CASE WHEN $10::bool IS NULL THEN disabled_reason
                           WHEN $10::bool THEN 'disabled by operator' END,
    previous_secret = CASE WHEN $11::text IS NULL THEN previous_secret ELSE secret END,
    previous_secret_until = CASE WHEN $11::text IS NULL THEN previous_secret_until
                                 ELSE now() + $12::bigint * interval '1 millisecond' END,
    secret = coalesce($11::text, secret),
    breaker = CASE WHEN $13::bool THEN 'closed' ELSE breaker END,
    paused_until = CASE WHEN $13::bool THEN NULL ELSE paused_until END,
    consecutive_failures = CASE WHEN $13::bool THEN 0 ELSE consecutive_failures END,
    breaker_pause_ms = CASE WHEN $13::bool THEN 0 ELSE breaker_pause_ms END,
    failing_since = CASE WHEN $13::bool THEN NULL ELSE failing_since END,
    disabled_at = CASE WHEN $10::bool IS NULL THEN disabled_at
                       WHEN $10::bool THEN coalesce(disabled_at, now()) END,
    rate_limit = CASE WHEN $14::bool THEN $15::float8 ELSE rate_limit END,
    headers = CASE WHEN $16::bool THEN $17::text::jsonb ELSE headers END,
    retry_schedule = CASE WHEN $18::bool THEN $19::float8[] ELSE retry_schedule END,
    filter = CASE WHEN $21::bool THEN $22::text::jsonb ELSE filter END,
    filter_path = CASE WHEN $21::bool THEN $23::text::jsonpath ELSE filter_path END,
    channels = CASE WHEN $24::bool THEN $25::text[] ELSE channels END,
    tls_client_cert = CASE WHEN $26::bool THEN $27::text ELSE tls_client_cert END,
    tls_client_key = CASE WHEN $26::bool THEN $28::text ELSE tls_client_key END,
    tls_ca_bundle = CASE WHEN $26::bool THEN $29::text ELSE tls_ca_bundle END,
    proxy = CASE WHEN $30::bool THEN $31::text ELSE proxy END,
    auth = CASE WHEN $32::bool THEN $33::text::jsonb ELSE auth END,
    egress_revision = CASE
        WHEN NOT ($26::bool OR $30::bool OR $32::bool) THEN egress_revision
        WHEN CASE WHEN $26::bool THEN $27::text ELSE tls_client_cert END IS NULL
             AND CASE WHEN $26::bool THEN $29::text ELSE tls_ca_bundle END IS NULL
             AND CASE WHEN $30::bool THEN $31::text ELSE proxy END IS NULL
             AND CASE WHEN $32::bool THEN $33::text ELSE auth::text END IS NULL THEN NULL
        ELSE nextval('egress_revision_seq') END,
    propagate_trace = coalesce($34::bool, propagate_trace),
    updated_at = now()
WHERE id = $1::bigint AND tenant_id = $20::bigint AND deleted_at IS NULL
RETURNING
    id, url, event_types, max_in_flight, ordered, timeout_ms, paused, disabled,
    disabled_reason, paused_until, breaker::text, consecutive_failures, created_at,
    updated_at, rate_limit, headers, retry_schedule, failing_since, secret,
    previous_secret_until, filter, channels, tls_client_cert, tls_client_key IS NOT NULL,
    tls_ca_bundle, proxy, auth - 'client_secret', propagate_trace

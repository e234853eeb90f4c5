-- destination_egress_read: a destination's egress settings, which a worker reads once per
-- egress revision (engine/worker/egress.py; schema/023_egress.sql).
--   $1 destination id bigint
-- Returns egress_revision, tls_client_cert, tls_client_key, tls_ca_bundle, proxy, auth.
SELECT egress_revision, tls_client_cert, tls_client_key, tls_ca_bundle, proxy, auth
  FROM destinations WHERE id = $1::bigint

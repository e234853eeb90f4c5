-- Egress per destination (SPEC, "Egress"; docs/decisions/0034-egress.md): mutual TLS and
-- a private CA (PEM text, handed to libcurl as blobs, never written to a file), a forward
-- proxy, and OAuth2 client credentials. All NULL for a destination without them.
--
-- egress_revision: NULL while a destination has none of them, else a new value from
-- egress_revision_seq at every change of any of them. The claim returns only this number
-- (claim_batch.sql): a worker reads a destination's egress settings once per revision
-- (destination_egress_read.sql) and keeps them, so the claims of a destination with
-- certificates carry no certificates, and those of one without cost one NULL column.
CREATE SEQUENCE egress_revision_seq;
ALTER TABLE destinations
    ADD COLUMN tls_client_cert text,
    ADD COLUMN tls_client_key text,
    ADD COLUMN tls_ca_bundle text,
    ADD COLUMN proxy text,
    -- {type: "oauth2_client_credentials", token_url, client_id, client_secret, scope?}
    ADD COLUMN auth jsonb,
    ADD COLUMN egress_revision bigint,
    ADD CONSTRAINT destinations_tls_pair CHECK ((tls_client_cert IS NULL) = (tls_client_key IS NULL)),
    ADD CONSTRAINT destinations_auth_type CHECK (
        auth IS NULL OR auth->>'type' = 'oauth2_client_credentials'),
    ADD CONSTRAINT destinations_egress_revision CHECK (
        (egress_revision IS NULL) = (tls_client_cert IS NULL AND tls_ca_bundle IS NULL
                                     AND proxy IS NULL AND auth IS NULL));

-- OAuth2 access tokens, one per destination, shared by every worker on every host: a
-- token is fetched by one of them (under the advisory lock (class, destination id),
-- oauth_token_lock.sql) and used by all until refresh_at. A token fetched for an older
-- egress revision (the credentials changed since) is not used.
CREATE TABLE oauth_tokens (
    destination_id bigint PRIMARY KEY REFERENCES destinations (id) ON DELETE CASCADE,
    egress_revision bigint NOT NULL,
    access_token text NOT NULL,
    fetched_at timestamptz NOT NULL,
    -- When the worker stops using it: a tenth of its lifetime, and at most 60 s, before
    -- it expires (engine/webhooks/oauth.py, refresh_at).
    refresh_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

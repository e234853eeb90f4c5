-- The customer portal's signing keys (SPEC, "Customer portal and event-type catalog";
-- docs/decisions/0031-portal-links.md). A portal link carries a token signed with the
-- live key (HMAC-SHA256); every ingress process on every host holds the live key in
-- memory and reloads it when auth_generation moves, so a key made or rotated by one
-- process signs and verifies on all of them within a refresh. One live key at most: a
-- rotation retires the old one, and every link it signed stops working at once. The
-- first link made creates the first key (its 32 bytes come from the ingress process's
-- CSPRNG, not from the database, which has no such function without pgcrypto).
CREATE TABLE portal_signing_keys (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    secret bytea NOT NULL CHECK (length(secret) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    retired_at timestamptz
);
CREATE UNIQUE INDEX portal_signing_keys_live_idx ON portal_signing_keys ((true))
    WHERE retired_at IS NULL;

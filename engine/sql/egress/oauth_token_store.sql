-- oauth_token_store: keep the token just fetched for every worker on every host.
--   $1 destination id bigint, $2 egress revision bigint, $3 access token text,
--   $4 lifetime s float8 (expires_in), $5 refresh after s float8 (engine/webhooks/oauth.py
--   refresh_after_s: shortly before it expires)
INSERT INTO oauth_tokens (destination_id, egress_revision, access_token, fetched_at,
                          refresh_at, expires_at)
VALUES ($1::bigint, $2::bigint, $3::text, now(),
        now() + make_interval(secs => $5::float8), now() + make_interval(secs => $4::float8))
ON CONFLICT (destination_id) DO UPDATE
   SET egress_revision = excluded.egress_revision, access_token = excluded.access_token,
       fetched_at = excluded.fetched_at, refresh_at = excluded.refresh_at,
       expires_at = excluded.expires_at

-- oauth_token_read: the destination's OAuth2 access token, if one was fetched for this
-- egress revision and its refresh time has not come (engine/worker/egress.py).
--   $1 destination id bigint, $2 egress revision bigint
-- Returns access_token, how many seconds it may still be used before a refresh, and how
-- many until it expires (float8 each).
SELECT access_token, extract(epoch FROM refresh_at - now())::float8 AS usable_s,
       extract(epoch FROM expires_at - now())::float8 AS alive_s
  FROM oauth_tokens
 WHERE destination_id = $1::bigint AND egress_revision = $2::bigint AND refresh_at > now()

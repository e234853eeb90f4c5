-- portal_key_live: the signing key portal tokens are made and checked with, read with the
-- live API keys (keys_live.sql) whenever auth_generation moved (engine/ingress/keys.py).
-- No row before the first portal link. One row at most (portal_signing_keys_live_idx).
-- Returns id, secret.
SELECT id, secret FROM portal_signing_keys WHERE retired_at IS NULL

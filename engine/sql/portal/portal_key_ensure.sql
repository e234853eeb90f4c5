-- portal_key_ensure: the first portal link of an engine makes the signing key, unless
-- another process made one first (the live key's unique index settles the race: one of
-- two concurrent inserts does nothing). auth_generation moves when a key was made, so
-- every ingress process loads it within keys.REFRESH_S (engine/ingress/keys.py).
--   $1 secret bytea: 32 bytes from the caller's CSPRNG
WITH made AS (
    INSERT INTO portal_signing_keys (secret) VALUES ($1::bytea)
        ON CONFLICT DO NOTHING
 RETURNING id
), moved AS (
    UPDATE auth_generation SET generation = generation + 1
     WHERE EXISTS (SELECT 1 FROM made)
)
SELECT id FROM made

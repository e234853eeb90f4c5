-- portal_key_rotate: `engine portal rotate-key`: the live signing key is retired and a new
-- one signs from now on. Every link signed before stops working on every ingress process
-- within keys.REFRESH_S (auth_generation moves). The retired row is updated before the
-- insert runs (data-modifying CTEs see their own rows' updates in the unique check), so
-- the new key does not conflict with the old one.
--   $1 secret bytea: 32 bytes from the caller's CSPRNG
-- Returns the new key's id and how many keys it retired (0 or 1).
WITH retired AS (
    UPDATE portal_signing_keys SET retired_at = now()
     WHERE retired_at IS NULL
 RETURNING id
), made AS (
    INSERT INTO portal_signing_keys (secret)
    SELECT $1::bytea FROM (SELECT count(*) FROM retired) AS after_retiring
 RETURNING id
), moved AS (
    UPDATE auth_generation SET generation = generation + 1
)
SELECT (SELECT id FROM made), (SELECT count(*) FROM retired)

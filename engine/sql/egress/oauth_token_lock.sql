-- oauth_token_lock: take the destination's token lock for this transaction: no more than
-- one token request per destination at a time, across processes and hosts. A worker that
-- waited here reads the token the holder stored (oauth_token_read.sql) before fetching.
--   $1 advisory lock class int, $2 destination id bigint
-- The lock's key is (class, id): ids beyond int4 wrap, which may only make two
-- destinations wait for each other.
SELECT pg_advisory_xact_lock($1::int, ($2::bigint % 2147483648)::int)

-- keys_mark_used: when keys were last used, written by each ingress process every few
-- seconds for the keys it saw (engine/ingress/keys.py), never once per request. A later
-- time only: several processes write the same key.
--   $1 key ids bigint[], $2 used at timestamptz[] (pairs, position by position)
UPDATE api_keys k
   SET last_used_at = greatest(k.last_used_at, u.used_at)
  FROM unnest($1::bigint[], $2::timestamptz[]) AS u(id, used_at)
 WHERE k.id = u.id

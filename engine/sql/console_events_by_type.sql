-- console_events_by_type: GET /v1/events?type=, newest first (created_at, then id), keyset paging.
--   $5 type text, $1 since timestamptz (NULL: no bound), $2 until timestamptz (NULL: no bound),
--   $3 cursor: the id of the last event of the previous page (NULL: first page),
--   $4 limit int
-- A backward range scan of events_type_created_idx that stops at the limit. The cursor's
-- created_at is looked up by primary key (an InitPlan, so it is an index bound); a cursor
-- whose event retention has removed yields an empty page rather than the first one again.
SELECT id, type, ordering_key, idempotency_key, delivery_count, created_at
  FROM events
 WHERE type = $5::text
   AND created_at >= coalesce($1::timestamptz, '-infinity')
   AND created_at <= coalesce($2::timestamptz, 'infinity')
   AND (created_at, id) < (
         coalesce((SELECT c.created_at FROM events c WHERE c.id = $3::bigint),
                  CASE WHEN $3::bigint IS NULL THEN 'infinity'::timestamptz
                       ELSE '-infinity'::timestamptz END),
         coalesce($3::bigint, 9223372036854775807))
 ORDER BY created_at DESC, id DESC
 LIMIT $4::int

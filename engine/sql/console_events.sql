-- console_events: GET /v1/events (?type=), newest first (created_at, then id), keyset paging.
--   $1 since timestamptz (NULL: no bound), $2 until timestamptz (NULL: no bound),
--   $3 after id bigint (the cursor: the id of the last event of the previous page;
--   NULL: first page), $4 limit int, $5 event type text (NULL: any)
-- A backward scan of events_created_id_idx, or of events_type_created_idx for one type,
-- from one (created_at, id) bound, stopping at the limit or at `since`. `until` and the
-- cursor are folded into that single bound (the lower of the two) because the scan can
-- only start from one key: given both as separate conditions, it would start at `until`
-- and filter its way down to the cursor. The cursor's created_at is looked up by primary
-- key; a cursor whose event retention has removed yields an empty page rather than the
-- first page again.
WITH bound AS MATERIALIZED (
    SELECT CASE WHEN $3::bigint IS NULL THEN coalesce($2::timestamptz, 'infinity')
                WHEN c.id IS NULL THEN '-infinity'
                ELSE least(c.created_at, coalesce($2::timestamptz, 'infinity')) END
               AS created_at,
           CASE WHEN $3::bigint IS NULL THEN 9223372036854775807
                WHEN c.id IS NULL THEN 0
                WHEN c.created_at <= coalesce($2::timestamptz, 'infinity') THEN c.id
                ELSE 9223372036854775807 END AS id
      FROM (SELECT) AS one
      LEFT JOIN events c ON c.id = $3::bigint
)
SELECT id, type, ordering_key, idempotency_key, delivery_count, created_at
  -- Two walks, one per index: each arm says which type it keeps, '' for every type ('' is
  -- no event's type: the API takes 1 to 256 characters, ingress/schemas.py EventType).
  -- `wanted = coalesce($5, '')` makes the arm that does not apply a one-time filter that
  -- reads nothing (the other arm's probe of '' finds nothing at once), and keeps
  -- `type = $5` an equality the type index orders by in a generic plan too, where
  -- `$5 IS NULL OR type = $5` would lose that index.
  FROM (SELECT '' AS wanted, * FROM events UNION ALL SELECT type, * FROM events) AS e
 WHERE wanted = coalesce($5::text, '')
   AND created_at >= coalesce($1::timestamptz, '-infinity')
   AND (created_at, id) < ((SELECT created_at FROM bound), (SELECT id FROM bound))
 ORDER BY created_at DESC, id DESC
 LIMIT $4::int

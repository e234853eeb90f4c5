-- console_events: GET /v1/events (?type=), newest first (created_at, then id), keyset paging.
--   $1 since timestamptz (NULL: no bound), $2 until timestamptz (NULL: no bound),
--   $3 after id bigint (the cursor: the id of the last event of the previous page;
--   NULL: first page), $4 limit int, $5 event type text (NULL: any), $6 tenant id bigint
-- A backward scan of events_tenant_created_idx, or of events_tenant_type_created_idx for one type,
-- from one (created_at, id) bound, stopping at the limit or at `since`. The bound is
-- keyset_start() (schema/014) of `until` and the cursor's event, looked up by primary key.
WITH bound AS MATERIALIZED (
    SELECT s.created_at, s.id
      FROM (SELECT) AS one
      LEFT JOIN events c ON c.id = $3::bigint AND c.tenant_id = $6::bigint
     CROSS JOIN keyset_start($3::bigint IS NOT NULL, c.created_at, c.id, $2::timestamptz) s
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
   -- The tenant here, not inside the arms: so each arm stays a plain relation that the
   -- planner merges in index order (a condition within the arms made it hash and sort).
   AND tenant_id = $6::bigint
   AND created_at >= coalesce($1::timestamptz, '-infinity')
   AND (created_at, id) < ((SELECT created_at FROM bound), (SELECT id FROM bound))
 ORDER BY created_at DESC, id DESC
 LIMIT $4::int

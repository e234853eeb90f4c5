-- console_deliveries_by_event: GET /v1/deliveries with event_type, since or until (any of
-- them), newest event first, then the event's deliveries by id descending, keyset paging.
--   $1 event type text (NULL: any), $2 since timestamptz (NULL: no bound),
--   $3 until timestamptz (NULL: no bound), $4 status text (NULL: any),
--   $5 destination id bigint (NULL: any),
--   $6 after id bigint (the cursor: the id of the last delivery of the previous page;
--   NULL: first page),
--   $7 limit int, $8 tenant id bigint
-- Deliveries carry no event type: walk events_tenant_created_idx, or
-- events_tenant_type_created_idx
-- for one type (the two arms as in console_events.sql), backwards and take each event's
-- deliveries (delivery_rows, schema/014) from the two event_id indexes; an incremental
-- sort (the rows come ordered by event already) stops as soon as the page is full. The
-- walk starts from keyset_start() (schema/014) of `until` and the cursor's event. The
-- cursor is a delivery id; its event is found by primary keys, so paging is exact even
-- where delivery ids and event times disagree.
WITH cursor_event AS MATERIALIZED (
    SELECT e.created_at, e.id
      FROM events e
     WHERE e.id = (SELECT event_id FROM delivery_rows WHERE id = $6::bigint LIMIT 1)
       AND e.tenant_id = $8::bigint
), bound AS MATERIALIZED (
    SELECT s.created_at, s.id AS event_id, c.id AS cursor_event_id
      FROM (SELECT) AS one
      LEFT JOIN cursor_event c ON true
     CROSS JOIN keyset_start($6::bigint IS NOT NULL, c.created_at, c.id, $3::timestamptz) s
)
SELECT d.id, d.event_id, d.destination_id, d.status, d.attempt, d.next_attempt_at,
       d.last_error, d.created_at, d.completed_at
  FROM (SELECT '' AS wanted, * FROM events UNION ALL SELECT type, * FROM events) AS e
  JOIN delivery_rows d ON d.event_id = e.id
 WHERE e.wanted = coalesce($1::text, '')
   -- The tenant here, not inside the arms: so each arm stays a plain relation that the
   -- planner merges in index order (a condition within the arms made it hash and sort).
   AND e.tenant_id = $8::bigint
   AND e.created_at >= coalesce($2::timestamptz, '-infinity')
   AND (e.created_at, e.id) <= ((SELECT created_at FROM bound), (SELECT event_id FROM bound))
   -- Within the cursor's own event, only the deliveries after it.
   AND (d.event_id IS DISTINCT FROM (SELECT cursor_event_id FROM bound) OR d.id < $6::bigint)
   AND ($4::text IS NULL OR d.status = $4::text)
   AND ($5::bigint IS NULL OR d.destination_id = $5::bigint)
 ORDER BY e.created_at DESC, e.id DESC, d.id DESC
 LIMIT $7::int

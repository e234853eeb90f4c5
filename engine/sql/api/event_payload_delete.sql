-- event_payload_delete: remove one event's payload, unless a queued delivery (pending or
-- in flight) still needs it: the claim sends it. Returns the id when removed, nothing when
-- a delivery waits (the API answers 409). After event_payload_lock.sql, in its
-- transaction; the event's metadata and its deliveries' history stay.
--   $1 event id bigint, $2 created at timestamptz
UPDATE events
   SET payload = NULL
 WHERE id = $1::bigint AND created_at = $2::timestamptz
   AND NOT EXISTS (SELECT 1 FROM deliveries WHERE event_id = $1::bigint)
RETURNING id

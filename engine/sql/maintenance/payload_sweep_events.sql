-- payload_sweep_events: clear the payloads of one bounded batch of events of one partition
-- (payload retention, engine/maintenance/partitions.py), walking it by id from a cursor.
--   $1 lower timestamptz (NULL: none), $2 upper timestamptz: the partition's bounds,
--   $3 after id bigint: the cursor, $4 batch limit int
-- Returns the batch's last id (NULL: none left), its rows, the payloads cleared and those
-- left: an event a queued delivery still needs keeps its payload (the claim sends it), and
-- a row locked meanwhile (a replay holding it, schema/014's requeue_finished through
-- replay_delivery.sql) is left for the next pass. The walk reads the partition's primary
-- key (id, created_at), pruned to the one partition by the bounds.
WITH batch AS (
    SELECT e.id, e.created_at, e.payload IS NOT NULL AS has_payload
      FROM events e
     WHERE e.created_at >= coalesce($1::timestamptz, '-infinity')
       AND e.created_at < $2::timestamptz
       AND e.id > $3::bigint
     ORDER BY e.id
     LIMIT $4::int
), clearable AS (
    SELECT e.id, e.created_at
      FROM events e
      JOIN batch b ON b.id = e.id AND b.created_at = e.created_at
     WHERE b.has_payload
       AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = b.id)
       FOR UPDATE OF e SKIP LOCKED
), cleared AS (
    UPDATE events e
       SET payload = NULL
      FROM clearable c
     WHERE e.id = c.id AND e.created_at = c.created_at
 RETURNING 1
)
SELECT (SELECT max(id) FROM batch), (SELECT count(*) FROM batch),
       (SELECT count(*) FROM cleared),
       (SELECT count(*) FROM batch WHERE has_payload) - (SELECT count(*) FROM cleared)

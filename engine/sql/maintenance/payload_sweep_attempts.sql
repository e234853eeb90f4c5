-- payload_sweep_attempts: clear the response bodies of one bounded batch of attempts of
-- one partition (payload retention, engine/maintenance/partitions.py), walking it by id
-- from a cursor, as payload_sweep_events.sql does; an attempt's body is history only, so
-- none is left behind.
--   $1 lower timestamptz (NULL: none), $2 upper timestamptz: the partition's bounds,
--   $3 after id bigint: the cursor, $4 batch limit int
-- Returns the batch's last id (NULL: none left), its rows, the bodies cleared, and 0.
WITH batch AS (
    SELECT a.id, a.started_at, a.response_body IS NOT NULL AS has_body
      FROM delivery_attempts a
     WHERE a.started_at >= coalesce($1::timestamptz, '-infinity')
       AND a.started_at < $2::timestamptz
       AND a.id > $3::bigint
     ORDER BY a.id
     LIMIT $4::int
), cleared AS (
    UPDATE delivery_attempts a
       SET response_body = NULL
      FROM batch b
     WHERE b.has_body AND a.id = b.id AND a.started_at = b.started_at
 RETURNING 1
)
SELECT (SELECT max(id) FROM batch), (SELECT count(*) FROM batch),
       (SELECT count(*) FROM cleared), 0

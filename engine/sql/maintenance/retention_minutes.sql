-- retention_minutes: delete one bounded batch of delivery_minutes rows (the console's
-- per-minute rollup, schema/011) older than the console reads, or older than the
-- retention cutoff when that is sooner (they count attempts retention has removed).
--   $1 cutoff timestamptz (retention's), $2 batch limit int,
--   $3 kept seconds float8 (the console's longest window and a margin:
--   engine/maintenance/retention.py MINUTES_KEPT_S)
-- The old rows are the low end of the primary key (minute first).
WITH old AS (
    SELECT minute, destination_id, writer
      FROM delivery_minutes
     WHERE minute < greatest($1::timestamptz, now() - $3::float8 * interval '1 second')
     ORDER BY minute
     LIMIT $2::int
       FOR UPDATE SKIP LOCKED
)
DELETE FROM delivery_minutes m
 USING old
 WHERE (m.minute, m.destination_id, m.writer) = (old.minute, old.destination_id, old.writer)

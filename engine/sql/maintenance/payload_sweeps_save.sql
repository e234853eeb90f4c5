-- payload_sweeps_save: record payload retention's progress in one partition, and forget
-- the partitions that are gone.
--   $1 partition text, $2 after id bigint, $3 left some bool, $4 complete bool
WITH saved AS (
    INSERT INTO payload_sweeps (partition, after_id, left_some, complete)
    VALUES ($1::text, $2::bigint, $3::bool, $4::bool)
        ON CONFLICT (partition) DO UPDATE
       SET after_id = excluded.after_id, left_some = excluded.left_some,
           complete = excluded.complete
)
DELETE FROM payload_sweeps
 WHERE partition <> $1::text
   AND partition NOT IN (SELECT partition FROM history_partitions())

-- retention_events: delete one bounded batch of events created before a cutoff that no
-- delivery refers to any more (neither queued nor finished). Runs after
-- retention_finished has removed the old finished deliveries.
--   $1 cutoff timestamptz, $2 batch limit int
-- The NOT EXISTS probes are index lookups (deliveries_event_idx,
-- finished_deliveries_event_idx). FOR UPDATE conflicts with the KEY SHARE lock a replay
-- or enqueue takes on an event it refers to, so an event cannot lose its row under a
-- delivery being written for it.
WITH old AS (
    SELECT e.id
      FROM events e
     WHERE e.created_at < $1
       AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id)
       AND NOT EXISTS (SELECT 1 FROM finished_deliveries f WHERE f.event_id = e.id)
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
DELETE FROM events e
 USING old
 WHERE e.id = old.id

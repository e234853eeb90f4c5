-- retention_events: delete one bounded batch of events created before a cutoff that no
-- delivery refers to any more (neither queued nor finished). Runs after
-- retention_finished has removed the old finished deliveries.
--   $1 cutoff timestamptz, $2 batch limit int
-- The NOT EXISTS probes are index lookups (deliveries_event_idx,
-- finished_deliveries_event_idx).
-- No foreign key guards the deletion (schema/005_no_delivery_foreign_keys.sql,
-- docs/decisions/0004-no-foreign-keys-on-hot-tables.md), and no lock
-- is needed instead: past its enqueue, a delivery row of an existing event is only ever
-- created by moving it between the two tables, deleting the old row in the same statement
-- (record_results, return_claims, replay_delivery, replay_dead). Both probes read this
-- statement's one snapshot, which holds a concurrent move's old row until the move
-- commits and its new row after, so an event whose delivery is being moved is never seen
-- without one; and an event seen without any can get none later, there being nothing left
-- to move. Keep it so: a statement that created a delivery for an existing event any other
-- way would have to lock the event row first (FOR KEY SHARE: this FOR UPDATE SKIP LOCKED
-- then leaves the event alone) and re-check that it still exists.
-- tests/test_maintenance.py interleaves retention with replays and completions.
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

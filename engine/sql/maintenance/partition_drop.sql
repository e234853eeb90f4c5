-- partition_drop: drop one dated partition of a history table (drop_history_partition(),
-- schema/026): its rows go at once, without a dead tuple. Takes ACCESS EXCLUSIVE on the
-- parent for an instant: run after lock_timeout_local.sql in one transaction.
--   $1 partition text
SELECT drop_history_partition($1::text)

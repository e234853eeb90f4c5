-- No foreign keys from deliveries and finished_deliveries to events and destinations
-- (the columns stay NOT NULL).
--
-- Why: each key is checked by a trigger per inserted row, an SPI query that also takes a
-- FOR KEY SHARE lock on the referenced row (dirtying it: WAL, and multixacts when several
-- transactions lock one destination). Those checks were 30-45 % of enqueue_events for a
-- 1000-event batch and 36 % of record_results, which re-checked on every move to
-- finished_deliveries keys the row already had (bench/sql_cost.py measures both).
--
-- What keeps the references valid instead:
-- * Destinations are never deleted, only soft-deleted (deleted_at; DELETE
--   /v1/destinations/{id} is an UPDATE in engine/ingress/store.py). Their deliveries stay,
--   and every claim path skips them by deleted_at.
-- * A delivery row is created only by enqueue_events.sql, in the statement that inserts
--   its event, for destinations it reads from `destinations` (unknown ids get no row; the
--   API refuses them beforehand with 422), and otherwise only moved: record_results and
--   return_claims move deliveries -> finished_deliveries, replay_delivery and replay_dead
--   move finished_deliveries -> deliveries, each delete and insert in one statement.
-- * Events are deleted only by retention_events.sql, and only when neither table holds a
--   delivery of the event. Its one statement snapshot sees each concurrent move either not
--   yet committed (the old row) or committed (the new row), never neither, and no
--   delivery can appear later for an event without one (see that file;
--   tests/test_maintenance.py interleaves retention with replays and completions).
ALTER TABLE deliveries DROP CONSTRAINT deliveries_event_id_fkey;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_destination_id_fkey;
ALTER TABLE finished_deliveries DROP CONSTRAINT finished_deliveries_event_id_fkey;
ALTER TABLE finished_deliveries DROP CONSTRAINT finished_deliveries_destination_id_fkey;

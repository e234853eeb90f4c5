-- engine: no transaction
-- Partitioned history, step 1 of 2 (issue 43, docs/decisions/0036): everything that reads
-- the big tables, done beside the running engine without blocking its writes; 026 then
-- swaps the tables for partitioned ones in one short transaction.
--
-- events, finished_deliveries and delivery_attempts become partitioned by time (created_at,
-- completed_at, started_at). Each table as it is becomes the partition `<table>_legacy`
-- for FROM (MINVALUE) TO (T), and daily partitions follow from T. T, the cutover time, is
-- the start of the UTC day after tomorrow (24 to 48 hours ahead), kept in history_cutover
-- so that every step of both files uses the same one. Three things make 026 short:
-- - A CHECK (<time> < T), added NOT VALID (catalog only, under a short lock_timeout: it
--   takes ACCESS EXCLUSIVE for an instant) then validated (SHARE UPDATE EXCLUSIVE: a scan
--   that blocks no read or write). ATTACH PARTITION finds the validated constraint implies
--   the partition bound and skips its own scan, which would hold ACCESS EXCLUSIVE for it.
--   Until 026 runs the running engine's rows fall under it (T is a day ahead at least);
--   026 refuses to run once T is less than an hour away.
-- - A unique index on (id, <time>), built CONCURRENTLY: a partitioned table's primary key
--   must hold its partition key, and 026 turns this index into the legacy partition's
--   primary key without building anything.
-- - idempotency_keys: a unique index on a partitioned table must hold the partition key,
--   so (tenant_id, idempotency_key) cannot stay unique on events. The keys move to a small
--   unpartitioned table written only for keyed events (enqueue_events.sql from 026 on). It
--   is filled here: a trigger copies every keyed event the running engine inserts from now
--   on, then a loop copies the existing ones in batches of 10,000 ids, committing each.
--   CREATE TRIGGER takes SHARE ROW EXCLUSIVE on events, so it waits for the transactions
--   inserting events to end: every event is either committed before the loop reads, or
--   inserted with the trigger firing. 026 drops the trigger.
-- The file runs again from the start if it fails midway (engine/db/migrate.py): each step
-- is written to be repeated.
CREATE TABLE IF NOT EXISTS history_cutover (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    cutover_at timestamptz NOT NULL
);
-- A second run much later (the first failed and nobody noticed) takes a new T, and the
-- CHECKs below are made again with it.
INSERT INTO history_cutover (cutover_at)
VALUES (date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '2 days')
    ON CONFLICT (only_row) DO UPDATE SET cutover_at = excluded.cutover_at
 WHERE history_cutover.cutover_at < now() + interval '12 hours';

CREATE TABLE IF NOT EXISTS idempotency_keys (
    tenant_id bigint NOT NULL,
    idempotency_key text NOT NULL,
    event_id bigint NOT NULL,
    event_created_at timestamptz NOT NULL,
    request_hash bytea,
    delivery_count integer NOT NULL,
    PRIMARY KEY (tenant_id, idempotency_key)
);
-- Retention removes the keys of events whose partition is gone (partition_keys_expire.sql).
CREATE INDEX IF NOT EXISTS idempotency_keys_event_created_idx
    ON idempotency_keys (event_created_at);

CREATE OR REPLACE FUNCTION idempotency_key_from_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO idempotency_keys (tenant_id, idempotency_key, event_id, event_created_at,
                                  request_hash, delivery_count)
    VALUES (NEW.tenant_id, NEW.idempotency_key, NEW.id, NEW.created_at, NEW.request_hash,
            NEW.delivery_count)
        ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

DO $$
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    CREATE OR REPLACE TRIGGER events_idempotency_key_copied AFTER INSERT ON events
        FOR EACH ROW WHEN (NEW.idempotency_key IS NOT NULL)
        EXECUTE FUNCTION idempotency_key_from_event();
END
$$;

DO $$
DECLARE
    after_id bigint := 0;
    upto bigint;
BEGIN
    SELECT coalesce(max(id), 0) INTO upto FROM events;
    WHILE after_id < upto LOOP
        INSERT INTO idempotency_keys (tenant_id, idempotency_key, event_id, event_created_at,
                                      request_hash, delivery_count)
        SELECT tenant_id, idempotency_key, id, created_at, request_hash, delivery_count
          FROM events
         WHERE id > after_id AND id <= after_id + 10000 AND idempotency_key IS NOT NULL
            ON CONFLICT DO NOTHING;
        after_id := after_id + 10000;
        COMMIT;
    END LOOP;
END
$$;

DO $$
DECLARE
    t timestamptz := (SELECT cutover_at FROM history_cutover);
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    EXECUTE format('ALTER TABLE events DROP CONSTRAINT IF EXISTS events_before_cutover,'
                   ' ADD CONSTRAINT events_before_cutover CHECK (created_at < %L) NOT VALID', t);
END
$$;
ALTER TABLE events VALIDATE CONSTRAINT events_before_cutover;
DO $$
DECLARE
    t timestamptz := (SELECT cutover_at FROM history_cutover);
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    EXECUTE format('ALTER TABLE finished_deliveries'
                   ' DROP CONSTRAINT IF EXISTS finished_deliveries_before_cutover,'
                   ' ADD CONSTRAINT finished_deliveries_before_cutover'
                   ' CHECK (completed_at < %L) NOT VALID', t);
END
$$;
ALTER TABLE finished_deliveries VALIDATE CONSTRAINT finished_deliveries_before_cutover;
DO $$
DECLARE
    t timestamptz := (SELECT cutover_at FROM history_cutover);
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    EXECUTE format('ALTER TABLE delivery_attempts'
                   ' DROP CONSTRAINT IF EXISTS delivery_attempts_before_cutover,'
                   ' ADD CONSTRAINT delivery_attempts_before_cutover'
                   ' CHECK (started_at < %L) NOT VALID', t);
END
$$;
ALTER TABLE delivery_attempts VALIDATE CONSTRAINT delivery_attempts_before_cutover;

DROP INDEX CONCURRENTLY IF EXISTS events_legacy_pkey;
CREATE UNIQUE INDEX CONCURRENTLY events_legacy_pkey ON events (id, created_at);
DROP INDEX CONCURRENTLY IF EXISTS finished_deliveries_legacy_pkey;
CREATE UNIQUE INDEX CONCURRENTLY finished_deliveries_legacy_pkey
    ON finished_deliveries (id, completed_at);
DROP INDEX CONCURRENTLY IF EXISTS delivery_attempts_legacy_pkey;
CREATE UNIQUE INDEX CONCURRENTLY delivery_attempts_legacy_pkey
    ON delivery_attempts (id, started_at);

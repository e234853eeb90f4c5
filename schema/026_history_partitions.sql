-- Partitioned history, step 2 of 2 (issue 43, docs/decisions/0036): events,
-- finished_deliveries and delivery_attempts become partitioned by time, in one short
-- transaction on top of what 025 prepared. Per table:
-- - the table is renamed `<table>_legacy`, its indexes `<table>_legacy_*`;
-- - a partitioned table takes its name, with the same columns (LIKE), PARTITION BY RANGE
--   of its time column;
-- - the legacy table is attached as the partition FROM (MINVALUE) TO (T), T from
--   history_cutover (025): its validated CHECK (<time> < T) spares the attach its scan;
-- - the parent's indexes are created: each finds the legacy table's index of the same
--   definition and attaches it (none is built: the primary key (id, <time>) is the index
--   025 built concurrently, made the legacy table's primary key first);
-- - a DEFAULT partition, so that a row no daily partition covers (a clock that jumped, the
--   partition job late) is still written; the partition job moves such rows into the
--   partition it creates for them (ensure_history_partitions below);
-- - daily partitions from T for 3 days; the partition job (engine/maintenance/
--   partitions.py) keeps creating them ahead and drops them behind.
-- Every step is a change to the catalog: the whole holds its locks for a time that does
-- not grow with the tables (0.15-0.2 s of ACCESS EXCLUSIVE with 1,000,000 finished
-- deliveries beside a running engine, bench/results/2026-12-07-issue-43-partition-
-- migration.md). The three
-- tables are locked first, in one statement, under a lock_timeout well under
-- deadlock_timeout, as 016 does (docs/decisions/0028), and the file is tried again when it
-- fires (engine/db/migrate.py).
--
-- Ids: events.id and delivery_attempts.id were identity columns, whose sequences belong to
-- the column: dropping the legacy partition would drop them. They become plain sequences
-- of the same names, continuing where the identity stopped, owned by the new column.
--
-- The rows of the legacy partition stay until T is older than retention_days (and, for
-- events, until nothing refers to them): history from before the migration lives at most
-- retention_days past T, once.
--
-- The engine from before this migration: its ingress refuses events from here (its
-- ON CONFLICT names (tenant_id, idempotency_key), which no longer has a unique index on
-- events) until its host is restarted on this version, as 017 did; its workers keep
-- delivering (their joins of events by id still find the rows, through every partition).
SET LOCAL lock_timeout = '200ms';
LOCK TABLE events, finished_deliveries, delivery_attempts IN ACCESS EXCLUSIVE MODE;

DO $$
BEGIN
    IF (SELECT cutover_at FROM history_cutover) < now() + interval '1 hour' THEN
        RAISE EXCEPTION 'the cutover time 025_history_partitions_prepare chose has (nearly) '
            'passed: delete its row from schema_migrations and run engine migrate again';
    END IF;
END
$$;

-- The legacy tables, their constraints and indexes renamed out of the parents' way. The
-- old primary keys (id alone) go: (id, <time>) replaces them, and a lookup by id reads it.
DROP TRIGGER events_idempotency_key_copied ON events;
DROP FUNCTION idempotency_key_from_event();
ALTER TABLE events RENAME TO events_legacy;
ALTER TABLE events_legacy DROP CONSTRAINT events_pkey,
    ADD CONSTRAINT events_legacy_pkey PRIMARY KEY USING INDEX events_legacy_pkey;
DROP INDEX events_created_at_idx;  -- BRIN for retention's deletes: partitions replace it
DROP INDEX events_tenant_idempotency_idx;  -- idempotency_keys holds the keys now
ALTER INDEX events_tenant_created_idx RENAME TO events_legacy_tenant_created_idx;
ALTER INDEX events_tenant_type_created_idx RENAME TO events_legacy_tenant_type_created_idx;

ALTER TABLE finished_deliveries RENAME TO finished_deliveries_legacy;
ALTER TABLE finished_deliveries_legacy DROP CONSTRAINT finished_deliveries_pkey,
    ADD CONSTRAINT finished_deliveries_legacy_pkey
        PRIMARY KEY USING INDEX finished_deliveries_legacy_pkey;
DROP TRIGGER finished_deliveries_tenant_unnamed ON finished_deliveries_legacy;
DROP INDEX finished_deliveries_completed_idx;
ALTER INDEX finished_deliveries_dead_id_idx RENAME TO finished_deliveries_legacy_dead_id_idx;
ALTER INDEX finished_deliveries_dead_idx RENAME TO finished_deliveries_legacy_dead_idx;
ALTER INDEX finished_deliveries_destination_idx
    RENAME TO finished_deliveries_legacy_destination_idx;
ALTER INDEX finished_deliveries_event_idx RENAME TO finished_deliveries_legacy_event_idx;
ALTER INDEX finished_deliveries_tenant_dead_idx
    RENAME TO finished_deliveries_legacy_tenant_dead_idx;
ALTER INDEX finished_deliveries_tenant_idx RENAME TO finished_deliveries_legacy_tenant_idx;

ALTER TABLE delivery_attempts RENAME TO delivery_attempts_legacy;
ALTER TABLE delivery_attempts_legacy DROP CONSTRAINT delivery_attempts_pkey,
    ADD CONSTRAINT delivery_attempts_legacy_pkey
        PRIMARY KEY USING INDEX delivery_attempts_legacy_pkey;
DROP INDEX delivery_attempts_started_idx;
ALTER INDEX delivery_attempts_delivery_idx RENAME TO delivery_attempts_legacy_delivery_idx;

-- The identity sequences become plain ones that outlive the legacy partition.
DO $$
DECLARE
    next_event bigint := nextval('events_id_seq');
    next_attempt bigint := nextval('delivery_attempts_id_seq');
BEGIN
    ALTER TABLE events_legacy ALTER COLUMN id DROP IDENTITY;
    ALTER TABLE delivery_attempts_legacy ALTER COLUMN id DROP IDENTITY;
    EXECUTE format('CREATE SEQUENCE events_id_seq AS bigint START WITH %s', next_event);
    EXECUTE format('CREATE SEQUENCE delivery_attempts_id_seq AS bigint START WITH %s',
                   next_attempt);
END
$$;

CREATE TABLE events (LIKE events_legacy INCLUDING DEFAULTS) PARTITION BY RANGE (created_at);
ALTER TABLE events ALTER COLUMN id SET DEFAULT nextval('events_id_seq'),
    ALTER COLUMN payload DROP NOT NULL;  -- payload retention and DELETE .../payload clear it
ALTER SEQUENCE events_id_seq OWNED BY events.id;
ALTER TABLE events_legacy ALTER COLUMN payload DROP NOT NULL;
DO $$
BEGIN
    EXECUTE format('ALTER TABLE events ATTACH PARTITION events_legacy'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)',
                   (SELECT cutover_at FROM history_cutover));
END
$$;
ALTER TABLE events ADD CONSTRAINT events_pkey PRIMARY KEY (id, created_at);
CREATE INDEX events_tenant_created_idx ON events (tenant_id, created_at, id);
CREATE INDEX events_tenant_type_created_idx ON events (tenant_id, type, created_at, id);
CREATE TABLE events_default PARTITION OF events DEFAULT;

CREATE TABLE finished_deliveries (LIKE finished_deliveries_legacy INCLUDING DEFAULTS
                                  INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (completed_at);
ALTER TABLE finished_deliveries DROP CONSTRAINT finished_deliveries_before_cutover;
DO $$
BEGIN
    EXECUTE format('ALTER TABLE finished_deliveries ATTACH PARTITION finished_deliveries_legacy'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)',
                   (SELECT cutover_at FROM history_cutover));
END
$$;
ALTER TABLE finished_deliveries
    ADD CONSTRAINT finished_deliveries_pkey PRIMARY KEY (id, completed_at);
CREATE INDEX finished_deliveries_dead_id_idx ON finished_deliveries (destination_id, id)
    WHERE status = 'dead';
CREATE INDEX finished_deliveries_dead_idx ON finished_deliveries (destination_id, completed_at)
    WHERE status = 'dead';
CREATE INDEX finished_deliveries_destination_idx ON finished_deliveries (destination_id, id);
CREATE INDEX finished_deliveries_event_idx ON finished_deliveries (event_id);
CREATE INDEX finished_deliveries_tenant_dead_idx ON finished_deliveries (tenant_id, id)
    WHERE status = 'dead';
CREATE INDEX finished_deliveries_tenant_idx ON finished_deliveries (tenant_id, id);
CREATE TRIGGER finished_deliveries_tenant_unnamed BEFORE INSERT ON finished_deliveries
    FOR EACH ROW WHEN (NEW.tenant_id IS NULL)
    EXECUTE FUNCTION delivery_tenant_from_destination();
CREATE TABLE finished_deliveries_default PARTITION OF finished_deliveries DEFAULT;

CREATE TABLE delivery_attempts (LIKE delivery_attempts_legacy INCLUDING DEFAULTS)
    PARTITION BY RANGE (started_at);
ALTER TABLE delivery_attempts ALTER COLUMN id SET DEFAULT nextval('delivery_attempts_id_seq');
ALTER SEQUENCE delivery_attempts_id_seq OWNED BY delivery_attempts.id;
DO $$
BEGIN
    EXECUTE format('ALTER TABLE delivery_attempts ATTACH PARTITION delivery_attempts_legacy'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)',
                   (SELECT cutover_at FROM history_cutover));
END
$$;
ALTER TABLE delivery_attempts ADD CONSTRAINT delivery_attempts_pkey PRIMARY KEY (id, started_at);
CREATE INDEX delivery_attempts_delivery_idx ON delivery_attempts (delivery_id, id);
CREATE TABLE delivery_attempts_default PARTITION OF delivery_attempts DEFAULT;

-- The view of schema/016 followed the rename to the legacy table: pointed at the parent.
CREATE OR REPLACE VIEW delivery_rows AS
SELECT id, event_id, destination_id, status::text AS status, attempt, next_attempt_at,
       last_error, created_at, NULL::timestamptz AS completed_at, tenant_id
  FROM deliveries
 UNION ALL
SELECT id, event_id, destination_id, status::text, attempt, next_attempt_at, last_error,
       created_at, completed_at, tenant_id
  FROM finished_deliveries;

-- history_partitions: the partitions of the three history tables with their bounds, read
-- from the catalog: NULL for MINVALUE (the legacy partition's lower bound) and both NULL
-- for a DEFAULT partition.
CREATE FUNCTION history_partitions()
RETURNS TABLE (parent text, partition text, lower timestamptz, upper timestamptz,
               is_default boolean)
LANGUAGE sql STABLE AS $$
SELECT p.relname::text, c.relname::text,
       CASE WHEN b.m[1] <> 'MINVALUE' THEN btrim(b.m[1], '''')::timestamptz END,
       btrim(b.m[2], '''')::timestamptz,
       b.m IS NULL
  FROM pg_inherits i
  JOIN pg_class p ON p.oid = i.inhparent
  JOIN pg_class c ON c.oid = i.inhrelid
 CROSS JOIN LATERAL (
       SELECT regexp_match(pg_get_expr(c.relpartbound, c.oid),
                           '^FOR VALUES FROM \((.*)\) TO \((.*)\)$') AS m) b
 WHERE p.relnamespace = 'public'::regnamespace
   AND p.relname IN ('events', 'finished_deliveries', 'delivery_attempts')
$$;

-- ensure_history_partitions: create the daily partitions (UTC days, named
-- <table>_pYYYYMMDD) of the three tables from the end of the last one (when there is none:
-- from the day of `since`, else today) up to `through`; returns how many it created. A
-- partition whose range already holds rows in the DEFAULT partition is created apart, the
-- rows moved into it, then attached (CREATE TABLE ... PARTITION OF would refuse it). Creating a partition takes ACCESS EXCLUSIVE on the
-- parent for an instant: the caller bounds the wait with lock_timeout.
CREATE FUNCTION ensure_history_partitions(through timestamptz,
                                          since timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET timezone = 'UTC' AS $$
DECLARE
    tbl text;
    key text;
    lo timestamptz;
    hi timestamptz;
    part text;
    strays boolean;
    made integer := 0;
BEGIN
    FOR tbl, key IN VALUES ('events', 'created_at'), ('finished_deliveries', 'completed_at'),
                           ('delivery_attempts', 'started_at') LOOP
        SELECT max(h.upper) INTO lo FROM history_partitions() h
         WHERE h.parent = tbl AND NOT h.is_default;
        lo := coalesce(lo, date_trunc('day', coalesce(since, now())));
        WHILE lo < through LOOP
            hi := lo + interval '1 day';
            part := format('%s_p%s', tbl, to_char(lo, 'YYYYMMDD'));
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE %I >= %L AND %I < %L)',
                           tbl || '_default', key, lo, key, hi) INTO strays;
            IF strays THEN
                EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS)', part, tbl);
                EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= %L AND %I < %L'
                               ' RETURNING *) INSERT INTO %I SELECT * FROM moved',
                               tbl || '_default', key, lo, key, hi, part);
                EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                               tbl, part, lo, hi);
            ELSE
                EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                               part, tbl, lo, hi);
            END IF;
            made := made + 1;
            lo := hi;
        END LOOP;
    END LOOP;
    RETURN made;
END
$$;

-- drop_history_partition: drop one partition of a history table (never a DEFAULT one).
-- Takes ACCESS EXCLUSIVE on the parent for an instant: the caller bounds the wait with
-- lock_timeout.
CREATE FUNCTION drop_history_partition(part text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM history_partitions() h
                    WHERE h.partition = part AND NOT h.is_default) THEN
        RAISE EXCEPTION 'not a dated partition of a history table: %', part;
    END IF;
    EXECUTE format('DROP TABLE %I', part);
END
$$;

SELECT ensure_history_partitions((SELECT cutover_at FROM history_cutover) + interval '3 days');

-- Payload retention's progress through each partition (engine/maintenance/partitions.py):
-- the last id a pass has reached, whether it left a payload behind (an event a delivery
-- still waits for, a row locked), and whether a pass finished leaving nothing.
CREATE TABLE payload_sweeps (
    partition text PRIMARY KEY,
    after_id bigint NOT NULL DEFAULT 0,
    left_some boolean NOT NULL DEFAULT false,
    complete boolean NOT NULL DEFAULT false
);

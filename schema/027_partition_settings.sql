-- A new day's partition takes the storage settings of the newest dated partition of its
-- table (autovacuum's, from `engine tune-autovacuum`, which sets them on each partition:
-- PostgreSQL keeps none on a partitioned table and gives a new partition none of its
-- own). Otherwise a tuned table would lose its tuning at the next day's partition.
-- Replaces ensure_history_partitions() of schema/026; the rest is as there. And
-- history_partitions() looks in the engine's own schema (current_schema(), as
-- status_tables.sql does), not in `public` by name.
CREATE OR REPLACE FUNCTION history_partitions()
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
 WHERE p.relnamespace = current_schema()::regnamespace
   AND p.relname IN ('events', 'finished_deliveries', 'delivery_attempts')
$$;

CREATE OR REPLACE FUNCTION ensure_history_partitions(through timestamptz,
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
    storage text;
    made integer := 0;
BEGIN
    FOR tbl, key IN VALUES ('events', 'created_at'), ('finished_deliveries', 'completed_at'),
                           ('delivery_attempts', 'started_at') LOOP
        SELECT max(h.upper) INTO lo FROM history_partitions() h
         WHERE h.parent = tbl AND NOT h.is_default;
        lo := coalesce(lo, date_trunc('day', coalesce(since, now())));
        SELECT coalesce(' WITH (' || array_to_string(c.reloptions, ', ') || ')', '')
          INTO storage
          FROM history_partitions() h
          JOIN pg_class c ON c.oid = h.partition::regclass
         WHERE h.parent = tbl AND NOT h.is_default
         ORDER BY h.upper DESC
         LIMIT 1;
        storage := coalesce(storage, '');
        WHILE lo < through LOOP
            hi := lo + interval '1 day';
            part := format('%s_p%s', tbl, to_char(lo, 'YYYYMMDD'));
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE %I >= %L AND %I < %L)',
                           tbl || '_default', key, lo, key, hi) INTO strays;
            IF strays THEN
                EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS)', part, tbl)
                        || storage;
                EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= %L AND %I < %L'
                               ' RETURNING *) INSERT INTO %I SELECT * FROM moved',
                               tbl || '_default', key, lo, key, hi, part);
                EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                               tbl, part, lo, hi);
            ELSE
                EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                               part, tbl, lo, hi) || storage;
            END IF;
            made := made + 1;
            lo := hi;
        END LOOP;
    END LOOP;
    RETURN made;
END
$$;

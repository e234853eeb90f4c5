-- status_tables: size, tuples and (auto)vacuum history of the engine's tables, with the
-- dead-tuple count at which autovacuum triggers (per-table reloptions, else the GUCs).
-- A partitioned table (the history tables, schema/026) has no statistics of its own: it
-- is the sum over its partitions, under its own name (sizes, tuples and vacuum counts
-- added up, the trigger over the partitions holding dead tuples; the last vacuum the
-- latest of any partition's), so a warning speaks of the table as a whole.
WITH settings AS (
    SELECT current_setting('autovacuum_vacuum_threshold')::float8 AS threshold,
           current_setting('autovacuum_vacuum_scale_factor')::float8 AS scale
), opts AS (
    SELECT c.oid,
           (SELECT split_part(o, '=', 2)::float8 FROM unnest(c.reloptions) o
             WHERE o LIKE 'autovacuum_vacuum_threshold=%') AS threshold,
           (SELECT split_part(o, '=', 2)::float8 FROM unnest(c.reloptions) o
             WHERE o LIKE 'autovacuum_vacuum_scale_factor=%') AS scale
      FROM pg_class c
), leaves AS (
    SELECT coalesce(p.relname, s.relname)::text AS name, s.*,
           coalesce(o.threshold, g.threshold)
               + coalesce(o.scale, g.scale) * greatest(c.reltuples, 0) AS vacuum_trigger
      FROM pg_stat_user_tables s
      JOIN pg_class c ON c.oid = s.relid
      JOIN opts o ON o.oid = s.relid
     CROSS JOIN settings g
      LEFT JOIN pg_inherits i ON i.inhrelid = s.relid
      LEFT JOIN pg_class p ON p.oid = i.inhparent AND p.relkind = 'p'
     WHERE s.schemaname = current_schema()
)
SELECT name,
       sum(pg_total_relation_size(relid))::bigint AS total_bytes,
       sum(pg_relation_size(relid))::bigint AS table_bytes,
       sum(pg_indexes_size(relid))::bigint AS index_bytes,
       sum(n_live_tup)::bigint AS n_live_tup, sum(n_dead_tup)::bigint AS n_dead_tup,
       -- Over the partitions with dead tuples: an empty or clean day's threshold would
       -- hide the one day autovacuum is behind on.
       coalesce(sum(vacuum_trigger) FILTER (WHERE n_dead_tup > 0), min(vacuum_trigger))
           AS vacuum_trigger,
       max(last_vacuum) AS last_vacuum, max(last_autovacuum) AS last_autovacuum,
       max(last_analyze) AS last_analyze, max(last_autoanalyze) AS last_autoanalyze,
       sum(autovacuum_count)::bigint AS autovacuum_count,
       extract(epoch FROM now() - greatest(max(last_vacuum), max(last_autovacuum)))::float8
           AS since_vacuum_s
  FROM leaves
 WHERE name IN ('destinations', 'events', 'deliveries', 'finished_deliveries',
                'delivery_attempts')
 GROUP BY name
 ORDER BY name

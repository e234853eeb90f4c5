-- status_tables: size, tuples and (auto)vacuum history of the engine's tables, with the
-- dead-tuple count at which autovacuum triggers (per-table reloptions, else the GUCs).
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
)
SELECT s.relname::text AS name,
       pg_total_relation_size(s.relid) AS total_bytes,
       pg_relation_size(s.relid) AS table_bytes,
       pg_indexes_size(s.relid) AS index_bytes,
       s.n_live_tup, s.n_dead_tup,
       coalesce(o.threshold, g.threshold)
           + coalesce(o.scale, g.scale) * greatest(c.reltuples, 0) AS vacuum_trigger,
       s.last_vacuum, s.last_autovacuum, s.last_analyze, s.last_autoanalyze,
       s.autovacuum_count,
       extract(epoch FROM now() - greatest(s.last_vacuum, s.last_autovacuum))::float8
           AS since_vacuum_s
  FROM pg_stat_user_tables s
  JOIN pg_class c ON c.oid = s.relid
  JOIN opts o ON o.oid = s.relid
 CROSS JOIN settings g
 WHERE s.schemaname = current_schema()
   AND s.relname IN ('destinations', 'events', 'deliveries', 'finished_deliveries',
                     'delivery_attempts')
 ORDER BY s.relname

-- status_indexes: the size and use of each index of the engine's tables.
SELECT relname::text AS table_name, indexrelname::text AS name,
       pg_relation_size(indexrelid) AS bytes, idx_scan
  FROM pg_stat_user_indexes
 WHERE schemaname = current_schema()
   AND relname IN ('destinations', 'events', 'deliveries', 'finished_deliveries',
                   'delivery_attempts')
 ORDER BY relname, indexrelname

-- table_sample: one sample of the bloat soak per table: live and dead tuples, rows
-- updated/deleted/inserted so far (what produces dead tuples), heap and index sizes,
-- autovacuum runs and, on PostgreSQL 18, the time they took in all (total_autovacuum_time,
-- read through to_jsonb so older servers answer NULL instead of failing). A partitioned
-- table (the history tables from schema/026 on) is the sum over its partitions, under the
-- parent's name: a dropped partition leaves the sum with its rows. Indexes named in $2
-- (the partial claim index) come as rows of their own, size only.
--   $1 table names text[], $2 index names text[]
SELECT coalesce(p.relname, s.relname) AS name, sum(s.n_live_tup)::bigint AS live,
       sum(s.n_dead_tup)::bigint AS dead,
       sum(s.n_tup_upd + s.n_tup_del)::bigint AS dead_made,
       sum(s.n_tup_ins)::bigint AS inserted,
       sum(pg_relation_size(s.relid))::bigint AS heap_bytes,
       sum(pg_indexes_size(s.relid))::bigint AS index_bytes,
       sum(s.autovacuum_count)::bigint AS autovacuum_count,
       sum((to_jsonb(s) ->> 'total_autovacuum_time')::float8) AS autovacuum_ms
  FROM pg_stat_user_tables s
  LEFT JOIN pg_inherits i ON i.inhrelid = s.relid
  LEFT JOIN pg_class p ON p.oid = i.inhparent AND p.relkind = 'p'
 WHERE coalesce(p.relname, s.relname) = ANY($1)
 GROUP BY 1
UNION ALL
SELECT i.indexrelname, NULL, NULL, NULL, NULL, NULL, pg_relation_size(i.indexrelid), NULL,
       NULL
  FROM pg_stat_user_indexes i
 WHERE i.indexrelname = ANY($2)

-- table_sample: one sample of the bloat soak per table: live and dead tuples, rows
-- updated/deleted/inserted so far (what produces dead tuples), heap and index sizes,
-- autovacuum runs and, on PostgreSQL 18, the time they took in all (total_autovacuum_time,
-- read through to_jsonb so older servers answer NULL instead of failing). Indexes named
-- in $2 (the partial claim index) come as rows of their own, size only.
--   $1 table names text[], $2 index names text[]
SELECT s.relname AS name, s.n_live_tup AS live, s.n_dead_tup AS dead,
       s.n_tup_upd + s.n_tup_del AS dead_made, s.n_tup_ins AS inserted,
       pg_relation_size(s.relid) AS heap_bytes, pg_indexes_size(s.relid) AS index_bytes,
       s.autovacuum_count,
       (to_jsonb(s) ->> 'total_autovacuum_time')::float8 AS autovacuum_ms
  FROM pg_stat_user_tables s
 WHERE s.relname = ANY($1)
UNION ALL
SELECT i.indexrelname, NULL, NULL, NULL, NULL, NULL, pg_relation_size(i.indexrelid), NULL,
       NULL
  FROM pg_stat_user_indexes i
 WHERE i.indexrelname = ANY($2)

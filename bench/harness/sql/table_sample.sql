-- table_sample: one sample of the bloat soak per table: live and dead tuples, heap and
-- index sizes, autovacuum counts and its last run. The claim index is a table of its own
-- in the sample (its size only) since it is what the claim scans.
--   $1 table names text[], $2 index names text[]
SELECT s.relname AS name, s.n_live_tup AS live, s.n_dead_tup AS dead,
       pg_relation_size(s.relid) AS heap_bytes,
       pg_indexes_size(s.relid) AS index_bytes,
       s.autovacuum_count, s.autoanalyze_count,
       extract(epoch FROM s.last_autovacuum)::float8 AS last_autovacuum
  FROM pg_stat_user_tables s
 WHERE s.relname = ANY($1)
UNION ALL
SELECT i.indexrelname, NULL, NULL, pg_relation_size(i.indexrelid), NULL, NULL, NULL, NULL
  FROM pg_stat_user_indexes i
 WHERE i.indexrelname = ANY($2)

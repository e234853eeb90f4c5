-- reloptions: the per-table storage settings (autovacuum_*) of the soaked tables.
--   $1 table names text[]
SELECT relname, coalesce(reloptions, '{}') FROM pg_class
 WHERE relname = ANY($1) AND relkind = 'r'

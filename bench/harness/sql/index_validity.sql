-- index_validity: each index of the tables the tenant migration touches, whether it is
-- valid (usable by queries) and ready (kept up to date by writes); a CREATE INDEX
-- CONCURRENTLY cut short leaves one invalid.
--   no parameters
SELECT c.relname, t.relname, i.indisvalid, i.indisready
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_class t ON t.oid = i.indrelid
 WHERE t.relname IN ('events', 'deliveries', 'finished_deliveries', 'destinations',
                     'tenants', 'api_keys')
 ORDER BY t.relname, c.relname

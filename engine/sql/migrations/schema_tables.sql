-- schema_tables: the public schema's tables (oid, name, storage options, partition key or
-- NULL), in creation order (engine/db/schema_dump.py). Partitions are left out: the
-- history tables' are made by date (schema/026), so they differ from one day to the next;
-- their parent shows what they hold.
--   $1 left out text[]: names of tables that are not part of the schema
SELECT c.oid, c.relname, c.reloptions,
       CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
   AND NOT c.relispartition
   AND c.relname <> ALL($1)
 ORDER BY c.oid

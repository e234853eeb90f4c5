-- schema_tables: the public schema's tables (oid, name, storage options), in creation
-- order (engine/db/schema_dump.py).
--   $1 left out text[]: names of tables that are not part of the schema
SELECT c.oid, c.relname, c.reloptions
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
   AND c.relname <> ALL($1)
 ORDER BY c.oid

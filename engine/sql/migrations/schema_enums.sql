-- schema_enums: the public schema's enum types and their labels, in creation order
-- (engine/db/schema_dump.py).
SELECT t.typname, array_agg(e.enumlabel ORDER BY e.enumsortorder)
  FROM pg_type t
  JOIN pg_enum e ON e.enumtypid = t.oid
  JOIN pg_namespace n ON n.oid = t.typnamespace
 WHERE n.nspname = 'public'
 GROUP BY t.oid, t.typname
 ORDER BY t.oid

-- schema_indexes: one table's index definitions, but those behind a PRIMARY KEY or UNIQUE
-- constraint (the constraint shows them) (engine/db/schema_dump.py).
--   $1 table oid bigint
SELECT pg_get_indexdef(i.indexrelid)
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = $1::oid
   AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
 ORDER BY c.relname

-- schema_constraints: one table's constraints and their definitions, not-null ones left
-- out (the columns show those) (engine/db/schema_dump.py).
--   $1 table oid bigint
SELECT conname, pg_get_constraintdef(oid)
  FROM pg_constraint
 WHERE conrelid = $1::oid AND contype <> 'n'
 ORDER BY contype, conname

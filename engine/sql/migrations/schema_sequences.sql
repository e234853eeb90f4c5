-- schema_sequences: the public schema's sequences and their types, in creation order
-- (engine/db/schema_dump.py). Identity columns' own sequences (deptype 'i') are left out:
-- their column implies them.
SELECT c.relname, format_type(s.seqtypid, NULL)
  FROM pg_sequence s
  JOIN pg_class c ON c.oid = s.seqrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public'
   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype = 'i')
 ORDER BY c.oid

-- schema_columns: one table's columns: name, type, not null, default, identity kind
-- (engine/db/schema_dump.py).
--   $1 table oid bigint
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid), a.attidentity
  FROM pg_attribute a
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum

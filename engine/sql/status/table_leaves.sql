-- table_leaves: the tables that hold a table's rows: the table itself, or a partitioned
-- table's partitions (the history tables, schema/026). Storage settings such as
-- autovacuum's belong to those: PostgreSQL refuses them on a partitioned table
-- (engine/observe/autovacuum_advice.py applies them to each leaf). pg_partition_tree
-- lists nothing for a table that is not partitioned.
--   $1 table name text
SELECT relid::text AS leaf FROM pg_partition_tree($1::regclass) WHERE isleaf
UNION ALL
SELECT oid::regclass::text FROM pg_class WHERE oid = $1::regclass AND relkind <> 'p'
ORDER BY leaf

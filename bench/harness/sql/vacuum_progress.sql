-- vacuum_progress: the tables of this database being vacuumed right now (autovacuum or
-- not), to time vacuums on servers without total_autovacuum_time (before 18).
--   no parameters
SELECT c.relname FROM pg_stat_progress_vacuum p JOIN pg_class c ON c.oid = p.relid
 WHERE p.datname = current_database()

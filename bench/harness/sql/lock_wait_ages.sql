-- lock_wait_ages: every lock request of this database's sessions not granted yet, how long
-- it has waited (pg_locks.waitstart, PostgreSQL 14 and later) and who waits: the migrator
-- is told apart by its application_name.
--   no parameters
SELECT a.application_name, l.locktype, l.mode, l.relation::regclass::text,
       extract(epoch FROM clock_timestamp() - l.waitstart) * 1000 AS waited_ms
  FROM pg_locks l
  JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE NOT l.granted AND a.datname = current_database()

-- lock_waits: how many sessions of this database wait on a heavyweight lock right now, and
-- how many lock requests are not granted (pg_locks). SKIP LOCKED should keep both near 0;
-- what remains is mostly the tuple/transactionid waits of UPDATEs on destinations.
--   no parameters
SELECT (SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock') AS waiting,
       (SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
         WHERE d.datname = current_database() AND NOT l.granted) AS not_granted

-- migrations_lock: one migrator at a time (engine/db/migrate.py); held by the session.
-- Tried, not waited for: engine/db/migrate.py asks again after a pause. A session waiting
-- inside pg_advisory_lock() is a running statement with a snapshot, and CREATE INDEX
-- CONCURRENTLY in the lock holder's migration (schema/017) waits for every such
-- transaction to end: the two would wait for each other.
--   $1 lock key bigint (engine/db/migrate.py MIGRATION_LOCK_KEY)
SELECT pg_try_advisory_lock($1)

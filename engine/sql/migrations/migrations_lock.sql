-- migrations_lock: one migrator at a time (engine/db/migrate.py); held by the session.
--   $1 lock key bigint (engine/db/migrate.py MIGRATION_LOCK_KEY)
SELECT pg_advisory_lock($1)

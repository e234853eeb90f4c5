-- migrations_unlock: release migrations_lock.sql's lock.
--   $1 lock key bigint (engine/db/migrate.py MIGRATION_LOCK_KEY)
SELECT pg_advisory_unlock($1)

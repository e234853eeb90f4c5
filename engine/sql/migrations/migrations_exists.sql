-- migrations_exists: whether this database was ever migrated.
SELECT to_regclass('schema_migrations') IS NOT NULL

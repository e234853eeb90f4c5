-- migrations_table: the record of applied migrations, created by the first migrator.
CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY, name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now())

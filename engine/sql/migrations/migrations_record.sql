-- migrations_record: note one migration as applied, in the transaction that applied it.
--   $1 version int, $2 name text
INSERT INTO schema_migrations (version, name) VALUES ($1, $2)

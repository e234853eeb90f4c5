-- migrations_newest: the newest migration applied, with its name (`engine status`).
SELECT version, name FROM schema_migrations ORDER BY version DESC LIMIT 1

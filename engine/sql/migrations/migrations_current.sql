-- migrations_current: the newest migration version applied (0: none).
SELECT coalesce(max(version), 0) FROM schema_migrations

-- reload_server_config: after `engine tune-autovacuum --apply` changed server-wide
-- settings (ALTER SYSTEM), the server reads them without a restart.
SELECT pg_reload_conf()

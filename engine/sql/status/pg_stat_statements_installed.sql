-- pg_stat_statements_installed: a row when the extension is installed (`engine status`
-- then reads its statement statistics, status_statements.sql).
SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'

-- reset_autovacuum: drop the schema's per-table autovacuum settings from deliveries, so
-- the bloat soak's "PostgreSQL defaults" variant runs under the server's GUCs alone.
--   no parameters
ALTER TABLE deliveries RESET (
    autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
    autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_insert_threshold,
    autovacuum_analyze_scale_factor, autovacuum_analyze_threshold,
    autovacuum_vacuum_cost_delay
)

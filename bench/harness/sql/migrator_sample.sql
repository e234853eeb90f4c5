-- migrator_sample: what the migrator's sessions (told apart by their application_name, $1)
-- are doing, sampled: the server's clock, each session's statement, when it began and its
-- state, and the table locks it holds that block the engine's writes (SHARE and
-- stronger: CREATE INDEX, CREATE TRIGGER, ALTER TABLE ...; parallel workers left out).
-- A relation created in the migrator's open transaction shows as its OID.
--   $1 application_name text
SELECT clock_timestamp(), a.pid, a.query_start, a.state, left(a.query, 160),
       coalesce(array_agg(l.relation::regclass::text || ':' || l.mode)
                    FILTER (WHERE l.relation IS NOT NULL), '{}')
  FROM pg_stat_activity a
  LEFT JOIN pg_locks l
    ON l.pid = a.pid AND l.granted AND l.locktype = 'relation'
   AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
 WHERE a.application_name = $1 AND a.datname = current_database()
   AND a.backend_type = 'client backend'
 GROUP BY a.pid, a.query_start, a.state, a.query

-- retention_cutoff: the database's now minus the retention, so every retention batch of
-- one run deletes by the same cutoff whatever the clocks of the engine's hosts say.
--   $1 retention seconds float8
SELECT now() - make_interval(secs => $1)

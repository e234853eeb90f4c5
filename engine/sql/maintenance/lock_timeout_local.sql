-- lock_timeout_local: bound this transaction's waits for locks (SET LOCAL), so that a
-- statement needing ACCESS EXCLUSIVE on a hot table (creating or dropping a partition,
-- engine/maintenance/partitions.py) gives up before the engine's queries queue behind it
-- for long, and is tried again.
--   $1 lock timeout text (a PostgreSQL duration, e.g. '200ms')
SELECT set_config('lock_timeout', $1::text, true)

-- leader_try_lock: take the maintenance leader's session advisory lock if it is free.
--   $1 lock key bigint (engine/maintenance/leader.py LEADER_LOCK_KEY)
SELECT pg_try_advisory_lock($1)

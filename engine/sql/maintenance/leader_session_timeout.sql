-- leader_session_timeout: the leader's session ends after this much silence, releasing
-- the leader lock with it (engine/maintenance/leader.py says why).
--   $1 idle_session_timeout text (e.g. '10s')
SELECT set_config('idle_session_timeout', $1, false)

-- end_stalled_claims: end the sessions of engine workers that have waited for their own
-- client in the middle of a transaction for longer than the bound (maintenance leader,
-- every tick). Returns the pids it ended.
--   $1 stalled after ms int: how long a session may wait for its client mid-transaction
--
-- Why: a claim is pipelined (engine/db/queue_async.py): its statements go out one by one,
-- and the Sync that ends each group after them. A worker frozen (SIGSTOP, a paused VM)
-- or starved between two of those sends leaves its session `active`, waiting to read
-- from the client (wait_event ClientRead), inside a transaction that holds what the
-- claim has taken so far: advisory locks of capped destinations, rate-limit rows, claimed
-- delivery rows not yet committed. The server's own bounds do not cover that state on
-- PostgreSQL before 17: idle_in_transaction_session_timeout applies only once the server
-- has answered a Sync (`idle in transaction`), and statement_timeout ends with each
-- statement. So until the frozen process ran again, other workers skipped those rows and
-- waited on those locks (tests/test_frozen_worker.py reproduces it;
-- docs/decisions/0014-stalled-claims-ended-by-the-leader.md).
-- Ending the session rolls the transaction back: the rows are claimable at once, and the
-- worker, when it runs again, finds its connection gone and reconnects, as after the
-- idle-in-transaction timeout (nothing it held was sent, so nothing is sent twice).
-- The same bound as idle_in_transaction_session_timeout (engine/db/database.py), measured
-- from state_change: an active session's state_change is the start of its last statement,
-- and a healthy claim's statements take milliseconds, its next message already on the
-- wire. A claim waiting on a lock waits on `Lock`, not `ClientRead`, so it is left alone;
-- one that waited longer than the bound and is looked at in the instant before its next
-- message arrives is ended too: it rolls back and the worker claims again, nothing lost.
-- Only our own role's sessions: pg_terminate_backend refuses others' (and says so with an
-- error) unless granted pg_signal_backend. The alternatives weighed: docs/decisions/0014.
SELECT pid, pg_terminate_backend(pid)
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND usename = current_user
   AND pid <> pg_backend_pid()
   AND application_name LIKE 'engine worker %'
   AND state = 'active'
   AND wait_event = 'ClientRead'
   AND xact_start IS NOT NULL
   AND state_change < clock_timestamp() - make_interval(secs => $1 / 1000.0)

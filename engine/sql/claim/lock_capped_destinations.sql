-- lock_capped_destinations: the first statement of a claim transaction. Takes the
-- transaction-level advisory lock of each destination with a max_in_flight cap, due work
-- and (by the counter) room below the cap, and returns their ids.
--   $1 advisory lock class int (the key space of "changing this destination's slot count
--      or breaker", shared with record_results.sql and return_claims.sql)
--   $2 limit int: the most destinations locked; a claim that locked this many claims again at once
--      (engine.db.queue.CAPPED_LOCKS_PER_CLAIM says why a bound)
--
-- How the cap stays exact across processes and hosts: destinations.in_flight counts the
-- slots taken (schema/006_capped_slot_counter.sql). Everything that changes it holds this
-- destination's advisory lock: the claim (from this statement until it commits), the
-- result write and the reaper. claim_batch.sql, the next statement, takes its snapshot
-- after this one, so it reads the counter as the previous holder committed it (a
-- transaction becomes visible before it releases its locks), and nobody changes it until
-- we commit. The counter makes a claim's cost independent of how many deliveries are in
-- flight: no count of the destination's in-flight rows (up to max_in_flight of them) on
-- every claim, as before.
-- Why a waiting lock, not a try-lock: with a try-lock a claimer that found the destination
-- busy claimed nothing from it that round, and with one busy capped destination a worker
-- came back empty-handed and waited for the next poll: a cap cost throughput long before
-- it was reached. The lock is held for one claim or one result write, a millisecond or so.
-- No deadlock: locks are taken in id order, here at the start of the transaction holding
-- nothing else; result writes and the reaper take theirs in id order too, after the
-- delivery rows they change, and the claim never waits for a delivery row (SKIP LOCKED).
-- Uncapped destinations cost nothing here: destinations_capped_idx holds only capped rows.
-- Whether a capped destination has due work is one probe of deliveries_destination_idx
-- per destination (the subquery with LIMIT is not flattened into a join). A plain EXISTS
-- was planned as a semi-join against every due row (the claimable index, read whole and
-- hashed by destination, or rescanned per destination), since a queue's statistics rarely
-- know how much is due (docs/decisions/0025). ORDER BY next_attempt_at is what
-- makes that index the plan's choice: it alone returns the rows in that order. DESC: the
-- probe descends from now() to the newest due row, the live end of the range; the rows
-- claimed since the last vacuum leave their entries at the old end, and a probe from there
-- stepped over all of them (docs/decisions/0038).
-- The destinations with room are shuffled first and probed in that order until $2 have
-- due work (the OFFSET 0 keeps the probe out of the shuffled subquery, so it is not run
-- for every row before the sort): a claim probes about as many destinations as it locks,
-- not every capped one, which cost milliseconds per claim with hundreds of capped
-- destinations (docs/decisions/0025). The random order spreads concurrent claimers over
-- different destinations, so that they rarely wait for each other's locks.
-- MATERIALIZED keeps the lock function from being evaluated before the cheaper filters (the
-- planner orders plain quals by cost, and would lock destinations without work); the ORDER
-- BY id subquery is the order the locks are taken in.
WITH candidates AS MATERIALIZED (
    SELECT shuffled.id
      FROM (SELECT dest.id
              FROM destinations dest
             WHERE dest.max_in_flight IS NOT NULL
               AND dest.in_flight < dest.max_in_flight
               AND NOT dest.disabled AND NOT dest.paused AND dest.deleted_at IS NULL
               -- not of a disabled tenant (tenants_disabled_idx: one descent, none found)
               AND dest.tenant_id <> ALL (ARRAY(SELECT id FROM tenants WHERE disabled AND deleted_at IS NULL))
               AND dest.breaker = 'closed'
             ORDER BY random()
            OFFSET 0) shuffled
     WHERE EXISTS (SELECT 1 FROM (SELECT 1 FROM deliveries d
                                   WHERE d.destination_id = shuffled.id
                                     AND d.status = 'pending'
                                     AND d.next_attempt_at <= now()
                                   ORDER BY d.next_attempt_at DESC
                                   LIMIT 1) due)
     LIMIT $2
)
SELECT id, pg_advisory_xact_lock($1, (id % 2147483648)::int)
  FROM (SELECT id FROM candidates ORDER BY id OFFSET 0) in_lock_order

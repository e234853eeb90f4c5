-- lock_limited_tenants: a statement of a claim transaction, after
-- lock_capped_destinations.sql. Takes the transaction-level advisory lock of each tenant
-- with a max_in_flight or a rate_limit of its own, room under them, and due work, and
-- returns their ids: claim_limited_tenants.sql, the next statement, claims for them.
--   $1 advisory lock class int (the key space of "changing this tenant's slot count or
--      its next send time", shared with record_results.sql and return_claims.sql)
--   $2 limit int: the most tenants locked (engine.db.queue.LIMITED_TENANTS_PER_CLAIM)
--
-- How the limits stay exact across processes and hosts (docs/decisions/0029): as a
-- destination's cap (lock_capped_destinations.sql). tenants.in_flight counts the slots
-- taken and rate_next_send_at is the tenant's next send time; everything that changes
-- either holds the tenant's advisory lock: the claim (from here until it commits), the
-- result write and the reaper. The next statement takes its snapshot after this one, so
-- it reads both as the previous holder committed them.
-- The pre-filters below read this statement's snapshot: a tenant found full may have
-- room by the time its lock is ours, and is simply claimed for next time; one found
-- with room is checked again by claim_limited_tenants.sql.
-- Lock order: after every destination lock of the transaction (the statement before),
-- in tenant id order; result writes and the reaper take theirs in the same order, after
-- their destinations' (record_results.sql). No cycle can form.
-- Shuffled, then probed for due work until $2 have it (lock_capped_destinations.sql says
-- why: concurrent claimers spread over different tenants, and a claim probes about as
-- many tenants as it locks). The probe is one descent of deliveries_tenant_due_idx.
-- tenants_set_aside_idx holds the limited tenants (and the disabled): an engine whose
-- tenants have no limits pays one empty index scan here.
WITH candidates AS MATERIALIZED (
    SELECT shuffled.id
      FROM (SELECT t.id
              FROM tenants t
             WHERE (t.disabled OR t.max_in_flight IS NOT NULL OR t.rate_limit IS NOT NULL)
               AND t.deleted_at IS NULL
               AND NOT t.disabled
               AND (t.max_in_flight IS NULL OR t.in_flight < t.max_in_flight)
               AND (t.rate_next_send_at IS NULL
                    OR t.rate_next_send_at <= statement_timestamp() + interval '1 second')
             ORDER BY random()
            OFFSET 0) shuffled
     WHERE EXISTS (SELECT 1 FROM (SELECT 1 FROM deliveries d
                                   WHERE d.tenant_id = shuffled.id
                                     AND d.status = 'pending'
                                     AND d.next_attempt_at <= now()
                                   ORDER BY d.next_attempt_at DESC
                                   LIMIT 1) due)
     LIMIT $2
)
SELECT id, pg_advisory_xact_lock($1, (id % 2147483648)::int)
  FROM (SELECT id FROM candidates ORDER BY id OFFSET 0) in_lock_order

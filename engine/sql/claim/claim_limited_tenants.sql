-- claim_limited_tenants: claim the due deliveries of the tenants with a max_in_flight or a
-- rate_limit of their own, within those limits, and mark them in flight; the statement
-- after lock_limited_tenants.sql, before claim_batch.sql (which leaves these tenants
-- alone), in one claim transaction.
--   $1 worker_id text, $2 limit int: the most deliveries claimed here, $3 lease_ms int,
--   $4 tenant ids bigint[]: those lock_limited_tenants.sql just locked
--   $5 capped destination ids bigint[]: those lock_capped_destinations.sql just locked
--   $6 destination ids bigint[] this worker wants none of now (claim_batch.sql's $6)
-- Returns claim_batch.sql's claim columns (without its tenant cursor), then the tenant's
-- id, rate_limit and first send time (a rate-limited tenant), the destination's first send
-- time (a rate-limited destination) and the statement's time. From them the caller sets
-- each claim's send time and the next send times, which book_send_times.sql writes in the
-- same transaction (engine/db/send_schedule.py).
--
-- Exact across processes and hosts (docs/decisions/0029): this statement's snapshot is
-- taken after the tenants' advisory locks ($4) and the capped destinations' ($5), so
-- their counters and next send times are as the previous holder committed them, and
-- nobody else changes them until we commit.
--
-- Each tenant's budget: the least of its room under max_in_flight, its send times up to
-- a second ahead under rate_limit (take_rate_tokens.sql says why a second), and an equal
-- share of $2 among the locked tenants and one more share: claim_batch.sql, which runs
-- next with what is left, and shares it among the other tenants (decision 0026).
-- Within a tenant each destination keeps its own limits: a capped destination gives at
-- most its room, and only while this transaction holds its lock ($5); a rate-limited one
-- at most its own send times up to a second ahead, its row locked here (FOR NO KEY
-- UPDATE SKIP LOCKED, as take_rate_tokens.sql does, which leaves these tenants'
-- destinations alone); one whose breaker is open and whose pause ran out gets its single probe (claim_batch.sql says
-- how a probe is won). The destinations are taken in a random order until the budget's
-- worth have due work (one probe of deliveries_destination_idx each), each scanned in
-- due order up to the least of its own room and the budget; the rows are then numbered
-- per tenant (`kept` says in which order) and kept up to the budget, and the claim's
-- rows interleave the tenants up to $2. Rows scanned beyond that (a tenant with several
-- destinations) stay locked, unclaimed, until we commit: at most the budget per
-- destination scanned. FOR UPDATE is not allowed beside a window function, so the rows
-- are numbered outside the locking scans.
-- Every row claimed takes one of its tenant's slots if the tenant is capped
-- (holds_tenant_slot, given back by its result), and one of its destination's if that
-- is capped (holds_slot), a probe excepted, as in claim_batch.sql. The rate limits' next
-- send times are left to book_send_times.sql: where a destination and its tenant are
-- both rate limited, the send times follow from both schedules at once, a sequential
-- choice that engine/db/send_schedule.py makes.
WITH limited AS (
    SELECT t.id AS tenant_id, t.max_in_flight, t.rate_limit,
           greatest(t.rate_next_send_at, statement_timestamp()) AS first_send_at,
           greatest(0, least(
               greatest(1, $2 / (cardinality($4::bigint[]) + 1)),
               coalesce(t.max_in_flight - t.in_flight, $2),
               coalesce(1 + floor(t.rate_limit * extract(epoch FROM
                   statement_timestamp() + interval '1 second'
                   - greatest(t.rate_next_send_at, statement_timestamp()))), $2)))::int
               AS budget
      FROM tenants t
     WHERE t.id = ANY ($4::bigint[])
       AND NOT t.disabled AND t.deleted_at IS NULL
       AND (t.max_in_flight IS NOT NULL OR t.rate_limit IS NOT NULL)
), with_work AS (
    -- Up to the budget's worth of each tenant's healthy destinations with due work.
    SELECT l.tenant_id, l.budget, l.rate_limit AS tenant_rate,
           l.first_send_at AS tenant_first_send_at, w.*
      FROM limited l
     CROSS JOIN LATERAL (
           SELECT shuffled.*
             FROM (SELECT dest.id AS destination_id, dest.max_in_flight, dest.in_flight,
                          dest.rate_limit, dest.breaker
                     FROM destinations dest
                    WHERE dest.tenant_id = l.tenant_id
                      AND NOT dest.disabled AND NOT dest.paused AND dest.deleted_at IS NULL
                      AND dest.id <> ALL ($6::bigint[])
                      AND (dest.breaker = 'closed' OR dest.paused_until <= now())
                      AND (dest.max_in_flight IS NULL OR dest.breaker <> 'closed'
                           OR dest.id = ANY ($5::bigint[]))
                    ORDER BY random()
                   OFFSET 0) shuffled
            WHERE EXISTS (SELECT 1 FROM (SELECT 1 FROM deliveries d
                                          WHERE d.destination_id = shuffled.destination_id
                                            AND d.status = 'pending'
                                            AND d.next_attempt_at <= now()
                                          ORDER BY d.next_attempt_at DESC
                                          LIMIT 1) due)
            LIMIT l.budget) w
     WHERE l.budget > 0
), probed AS (
    UPDATE destinations dest
       SET breaker = 'half_open',
           paused_until = clock_timestamp() + make_interval(secs => $3 / 1000.0)
      FROM (SELECT id FROM destinations
             WHERE id IN (SELECT destination_id FROM with_work WHERE breaker <> 'closed')
               AND breaker <> 'closed' AND paused_until <= now()
               FOR NO KEY UPDATE SKIP LOCKED) due
     WHERE dest.id = due.id
 RETURNING dest.id
), rate_booked AS (
    -- The rate-limited destinations' send times up to a second ahead (take_rate_tokens.sql).
    SELECT dest.id, dest.rate_limit,
           greatest(dest.rate_next_send_at, statement_timestamp()) AS first_send_at,
           greatest(0, 1 + floor(dest.rate_limit * extract(epoch FROM
               statement_timestamp() + interval '1 second'
               - greatest(dest.rate_next_send_at, statement_timestamp()))))::int AS tokens
      FROM destinations dest
     WHERE dest.id IN (SELECT destination_id FROM with_work
                        WHERE rate_limit IS NOT NULL AND breaker = 'closed')
       AND dest.breaker = 'closed'
       FOR NO KEY UPDATE OF dest SKIP LOCKED
), picked AS (
    SELECT w.tenant_id, w.budget, w.destination_id, w.probe, w.holds_slot, c.id,
           c.next_attempt_at
      FROM (SELECT ww.tenant_id, ww.budget, ww.destination_id,
                   p.id IS NOT NULL AS probe,
                   p.id IS NULL AND ww.max_in_flight IS NOT NULL AS holds_slot,
                   CASE WHEN p.id IS NOT NULL THEN 1
                        WHEN ww.breaker <> 'closed' THEN 0
                        ELSE least(ww.budget,
                                   coalesce(ww.max_in_flight - ww.in_flight, ww.budget),
                                   CASE WHEN ww.rate_limit IS NULL THEN ww.budget
                                        ELSE coalesce(r.tokens, 0) END,
                                   -- In a rate-limited tenant, its own send times that
                                   -- fall within the tenant's budget's: a later one would
                                   -- stretch the tenant's schedule, and leave its rate
                                   -- unused (engine/db/send_schedule.py).
                                   CASE WHEN ww.rate_limit IS NULL OR ww.tenant_rate IS NULL
                                        OR r.id IS NULL THEN ww.budget
                                        ELSE greatest(0, 1 + floor(ww.rate_limit * extract(
                                            epoch FROM ww.tenant_first_send_at
                                            + make_interval(secs => (ww.budget - 1)
                                                                    / ww.tenant_rate)
                                            - r.first_send_at)))::int END)
                   END AS room
              FROM with_work ww
              LEFT JOIN probed p ON p.id = ww.destination_id
              LEFT JOIN rate_booked r ON r.id = ww.destination_id) w
     CROSS JOIN LATERAL (
           SELECT d.id, d.next_attempt_at FROM claimable_deliveries d
            WHERE d.destination_id = w.destination_id
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at
            LIMIT greatest(0, w.room)
              FOR UPDATE OF d SKIP LOCKED) c
), kept AS (
    -- Numbered per tenant: probes first, then in due order.
    SELECT k.*
      FROM (SELECT n.*, row_number() OVER (ORDER BY n.k, n.tenant_id) AS overall
              FROM (SELECT p.*, row_number() OVER (PARTITION BY p.tenant_id
                                                   ORDER BY p.probe DESC,
                                                            p.next_attempt_at, p.id) AS k
                      FROM picked p) n
             WHERE n.k <= n.budget) k
     WHERE k.overall <= $2
), claimed AS (
    UPDATE deliveries d
       SET status = 'in_flight',
           attempt = d.attempt + 1,
           locked_by = $1,
           locked_until = clock_timestamp() + make_interval(secs => $3 / 1000.0),
           claim_token = (SELECT nextval('claim_token_seq')),
           holds_slot = k.holds_slot,
           holds_tenant_slot = l.max_in_flight IS NOT NULL
      FROM kept k
      JOIN limited l ON l.tenant_id = k.tenant_id
     WHERE d.id = k.id
 RETURNING d.id, d.event_id, d.destination_id, d.attempt, d.holds_slot, d.claim_token,
           d.tenant_id, d.holds_tenant_slot, d.created_at
), tenants_taken AS (
    UPDATE tenants t
       SET in_flight = t.in_flight + u.n
      FROM (SELECT tenant_id, count(*) AS n FROM claimed WHERE holds_tenant_slot
             GROUP BY tenant_id) u
     WHERE t.id = u.tenant_id
), slots_taken AS (
    UPDATE destinations dest
       SET in_flight = dest.in_flight + u.n
      FROM (SELECT destination_id, count(*) AS n FROM claimed WHERE holds_slot
             GROUP BY destination_id) u
     WHERE dest.id = u.destination_id
)
SELECT c.id, c.event_id, c.destination_id, c.attempt,
       dest.url, dest.timeout_ms,
       CASE WHEN dest.previous_secret IS NOT NULL AND dest.previous_secret_until > now()
            THEN ARRAY[dest.secret, dest.previous_secret]
            ELSE ARRAY[dest.secret] END AS secrets,
       ev.payload, dest.max_in_flight, dest.headers, dest.retry_schedule, dest.rate_limit,
       dest.egress_revision, ev.traceparent, dest.propagate_trace, dest.tenant_id,
       c.claim_token,
       coalesce(dest.in_flight + taken.n >= dest.max_in_flight, false) AS fills_cap,
       c.holds_slot,
       c.tenant_id, l.rate_limit AS tenant_rate_limit,
       CASE WHEN l.rate_limit IS NOT NULL THEN l.first_send_at END AS tenant_first_send_at,
       r.first_send_at AS destination_first_send_at, statement_timestamp()
  FROM claimed c
  JOIN limited l ON l.tenant_id = c.tenant_id
  JOIN destinations dest ON dest.id = c.destination_id
  -- By (id, created_at): one events partition per row (claim_batch.sql).
 CROSS JOIN LATERAL (
       -- LIMIT keeps the subquery from being flattened into a join the planner may make
       -- a merge join over every partition's index; as a parameterized scan it is pruned
       -- at run time to the one partition (tests/test_partition_plan.py).
       SELECT e.payload, e.traceparent FROM events e
        WHERE e.id = c.event_id AND e.created_at = c.created_at
        LIMIT 1) ev
  LEFT JOIN rate_booked r ON r.id = c.destination_id
  LEFT JOIN (SELECT destination_id, count(*) AS n FROM claimed
              WHERE holds_slot GROUP BY destination_id) taken
    ON taken.destination_id = c.destination_id

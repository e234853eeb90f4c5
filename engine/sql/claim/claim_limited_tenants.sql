-- claim_limited_tenants: claim the due deliveries of the tenants with a max_in_flight or a
-- rate_limit of their own, within those limits, and mark them in flight; the statement
-- after lock_limited_tenants.sql, before claim_batch.sql (which leaves these tenants
-- alone), in one claim transaction.
--   $1 worker_id text, $2 limit int: the most deliveries claimed here, $3 lease_ms int,
--   $4 tenant ids bigint[]: those lock_limited_tenants.sql just locked
--   $5 capped destination ids bigint[]: those lock_capped_destinations.sql just locked
--   $6 destination ids bigint[] this worker wants none of now (claim_batch.sql's $6)
-- Returns claim_batch.sql's claim columns (without its tenant cursor), then each claim's
-- send time under the rate limits (NULL: none) and how far ahead of this statement it
-- is (`scheduled` says how they are set): Claim's fields, in order.
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
-- at most its own send times, booked here on its row (FOR NO KEY UPDATE SKIP LOCKED, as
-- take_rate_tokens.sql does, which leaves these tenants' destinations alone); one whose
-- breaker is open and whose pause ran out gets its single probe (claim_batch.sql says
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
-- is capped (holds_slot), a probe excepted, as in claim_batch.sql. The tenant's and the
-- rate-limited destinations' next send times move past the send times used.
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
    SELECT l.tenant_id, l.budget, l.rate_limit AS tenant_rate, w.*
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
                                          ORDER BY d.next_attempt_at
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
    SELECT w.tenant_id, w.budget, w.destination_id, w.probe, w.holds_slot, w.rated,
           w.destination_rate, w.destination_first_send_at, c.id, c.next_attempt_at
      FROM (SELECT ww.tenant_id, ww.budget, ww.destination_id,
                   p.id IS NOT NULL AS probe,
                   p.id IS NULL AND ww.max_in_flight IS NOT NULL AS holds_slot,
                   r.id IS NOT NULL AS rated, r.rate_limit AS destination_rate,
                   r.first_send_at AS destination_first_send_at,
                   CASE WHEN p.id IS NOT NULL THEN 1
                        WHEN ww.breaker <> 'closed' THEN 0
                        ELSE least(ww.budget,
                                   coalesce(ww.max_in_flight - ww.in_flight, ww.budget),
                                   CASE WHEN ww.rate_limit IS NULL THEN ww.budget
                                        -- one per claim in a rate-limited tenant (below)
                                        WHEN ww.tenant_rate IS NOT NULL
                                        THEN least(1, coalesce(r.tokens, 0))
                                        ELSE coalesce(r.tokens, 0) END) END AS room
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
    -- Numbered per tenant: probes first, the rate-limited destinations' rows last (in
    -- the order of their own first send times), the rest in due order.
    SELECT k.*
      FROM (SELECT n.*, row_number() OVER (ORDER BY n.k, n.tenant_id) AS overall
              FROM (SELECT p.*, row_number() OVER (PARTITION BY p.tenant_id
                                                   ORDER BY p.probe DESC, p.rated,
                                                            p.destination_first_send_at,
                                                            p.next_attempt_at, p.id) AS k
                      FROM picked p) n
             WHERE n.k <= n.budget) k
     WHERE k.overall <= $2
), scheduled AS (
    -- Send times. A rate-limited tenant's k-th row (from 1) goes at its first send time +
    -- (k - 1) / rate. Its rows of a rate-limited destination (at most one per destination
    -- and claim, numbered last) go no earlier than the destination's own first send time
    -- either, and each at least 1/rate after the one before: the greedy schedule
    -- t(i) = max(c(i), t(i - 1) + 1/rate), whose closed form is the running maximum below.
    -- Numbered last, a row moved later passes no row of the tenant after it, so no two of
    -- the tenant's sends come closer than 1/rate; one per destination and claim, and the
    -- destination's next send time set 1/its rate after it, none of its own either.
    -- (Several per claim: a row moved later could come closer than 1/its rate to the
    -- destination's next one; docs/decisions/0029.) Elsewhere a rate-limited
    -- destination's m-th row goes at its first send time + m / its rate, as in
    -- take_rate_tokens.sql.
    SELECT k.id, k.tenant_id, k.destination_id, k.destination_rate,
           CASE WHEN l.rate_limit IS NOT NULL THEN greatest(
                    l.first_send_at + make_interval(secs => (k.k - 1) / l.rate_limit),
                    max(CASE WHEN k.rated THEN k.destination_first_send_at
                                               - make_interval(secs => k.k / l.rate_limit)
                             END) OVER (PARTITION BY k.tenant_id ORDER BY k.k)
                        + make_interval(secs => k.k / l.rate_limit))
                WHEN k.rated THEN k.destination_first_send_at
                     + make_interval(secs => (row_number() OVER (PARTITION BY k.destination_id
                                                                 ORDER BY k.k) - 1)
                                             / k.destination_rate)
           END AS send_at
      FROM kept k
      JOIN limited l ON l.tenant_id = k.tenant_id
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
           d.tenant_id, d.holds_tenant_slot
), tenants_taken AS (
    UPDATE tenants t
       SET in_flight = t.in_flight + CASE WHEN l.max_in_flight IS NULL THEN 0 ELSE u.n END,
           rate_next_send_at = CASE WHEN l.rate_limit IS NULL THEN t.rate_next_send_at
                                    ELSE u.last_send_at
                                         + make_interval(secs => 1 / l.rate_limit) END
      FROM (SELECT c.tenant_id, count(*) AS n, max(s.send_at) AS last_send_at
              FROM claimed c JOIN scheduled s ON s.id = c.id
             GROUP BY c.tenant_id) u
      JOIN limited l ON l.tenant_id = u.tenant_id
     WHERE t.id = u.tenant_id
), destinations_taken AS (
    UPDATE destinations dest
       SET in_flight = dest.in_flight + u.slots,
           rate_next_send_at = CASE WHEN u.rate IS NULL THEN dest.rate_next_send_at
                                    ELSE u.last_send_at
                                         + make_interval(secs => 1 / u.rate) END
      FROM (SELECT c.destination_id, count(*) FILTER (WHERE c.holds_slot) AS slots,
                   max(s.destination_rate) AS rate, max(s.send_at) AS last_send_at
              FROM claimed c JOIN scheduled s ON s.id = c.id
             GROUP BY c.destination_id) u
     WHERE dest.id = u.destination_id
       AND (u.slots > 0 OR u.rate IS NOT NULL)
)
SELECT c.id, c.event_id, c.destination_id, c.attempt,
       dest.url, dest.timeout_ms,
       CASE WHEN dest.previous_secret IS NOT NULL AND dest.previous_secret_until > now()
            THEN ARRAY[dest.secret, dest.previous_secret]
            ELSE ARRAY[dest.secret] END AS secrets,
       ev.payload, dest.max_in_flight, dest.headers, dest.retry_schedule, dest.rate_limit,
       c.claim_token,
       coalesce(dest.in_flight + taken.n >= dest.max_in_flight, false) AS fills_cap,
       c.holds_slot,
       s.send_at,
       coalesce(extract(epoch FROM s.send_at - statement_timestamp())::float8, 0) AS send_delay_s
  FROM claimed c
  JOIN scheduled s ON s.id = c.id
  JOIN destinations dest ON dest.id = c.destination_id
  JOIN events ev ON ev.id = c.event_id
  LEFT JOIN (SELECT destination_id, count(*) AS n FROM claimed
              WHERE holds_slot GROUP BY destination_id) taken
    ON taken.destination_id = c.destination_id

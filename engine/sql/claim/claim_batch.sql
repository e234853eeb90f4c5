-- claim_batch: lock up to $limit claimable deliveries, mark them in flight, and return
-- everything a worker needs to send them, in one round trip.
--   $1 worker_id text, $2 limit int, $3 first_attempt_reserve int, $4 lease_ms int,
--   $5 capped destination ids bigint[]: those lock_capped_destinations.sql just locked
--   $6 destination ids bigint[] this worker wants none of now: its requests to them are
--      piling up unanswered (a dead or very slow endpoint), so more of their deliveries
--      would only take the slots of healthy destinations. The scans walk past their rows.
--   $7 rate-limited destination ids bigint[], $8 tokens int[]: the send times
--      take_rate_tokens.sql just booked for each in this transaction (its row is locked by
--      us until we commit)
--   $9 tenant cursor bigint: the tenant this worker's last fair-share claim served last
--      (0 at first: from the highest); the walk over the tenants goes on below it
-- Returns the claims' columns, then `tenant_cursor`: the tenant this claim's fair share
-- served last (NULL when it shared nothing), the worker's next $9. The destination's
-- columns (url to tenant_id, all but payload and traceparent) are on the first row of
-- each destination only, NULL on the others, which take them from it
-- (engine/db/queue_async.py, `claim_rows`): a claim of 500 rows to one destination sent
-- its secrets, headers and schedule 500 times, and the worker decoded them 500 times
-- (docs/decisions/0037).
--
-- FOR UPDATE OF d SKIP LOCKED: lock only delivery rows. Without OF, the destination row
-- would be locked too, and every other claimer would skip all of that destination's
-- deliveries until we commit: one claimer per destination.
--
-- Every branch takes its deliveries from the view claimable_deliveries (schema/015):
-- pending, and first in line of their ordering key; and only those due.
--
-- Retries and first attempts are two range scans of deliveries_claimable_idx. Retries
-- may take at most ($limit - min($reserve, first attempts available)): after an outage
-- the due retries cannot crowd out fresh deliveries. Each branch names the index's key
-- `least(attempt, 1)` exactly, with `=`, so the scan comes out ordered by next_attempt_at
-- and stops after $limit rows (schema/004_claim_index_estimates.sql says why this key;
-- tests/test_claim_plan.py checks the plans).
--
-- The lease (locked_until, and a probe's pause) runs from clock_timestamp(), the moment
-- the rows are claimed, not from now(), the start of the transaction: a claimer stalled
-- between BEGIN and this statement must not commit a lease that has already run out
-- (the reaper would hand the rows to a second worker while the first sends them).
-- claim_token: one new value per claim statement (an InitPlan, evaluated once), which the
-- results of this claim must carry (schema/009_claim_token.sql).
--
-- The final UPDATE finds its rows by primary key (= ANY of the chosen ids) whatever the
-- planner thinks of the backlog's size.
--
-- A destination whose breaker is open and whose pause has run out gets exactly one probe
-- delivery: the UPDATE of its row to half_open is what a single claimer wins (the others
-- skip the locked row; one that read the row before the winner committed re-checks it
-- once locked and finds the new paused_until), and a lease-long pause covers the probe
-- should its worker die. Only destinations with a due delivery are probed, so a pause
-- does not run out into an empty half-open window. NO KEY UPDATE: the weakest lock that
-- excludes another claimer (the row's key does not change). Probes come first and
-- count against $limit (`room` is what they leave): a worker asks for its free slots, so
-- the batch never holds more than that.
--
-- Destinations with max_in_flight take their deliveries only through `capped`, one
-- LATERAL per destination this transaction holds the advisory lock of ($5): LIMIT is the
-- room left under the cap, max_in_flight minus the destination's slot counter, which
-- `slots_taken` raises by what was claimed; the claimed rows are marked holds_slot so
-- that their results give the slots back. The lock is what makes the counter exact
-- across processes and hosts (see lock_capped_destinations.sql). Uncapped destinations
-- keep the plain scans; `dest.max_in_flight IS NULL` is a filter on a row the join reads
-- anyway. A probe takes no slot (its destination is not locked; it is one delivery).
--
-- Destinations with a rate_limit take their deliveries only through `rated`: at most the
-- tokens (send times) take_rate_tokens.sql booked for them earlier in this transaction
-- ($7/$8), and what is left over goes back in the same statement (`rate_tokens_returned`,
-- which also takes the slots of those that are capped too).
-- The plain scans and `capped` skip them (`dest.rate_limit IS NULL`, again a filter on a
-- row the join reads anyway).
--
-- Fair share among tenants (docs/decisions/0026): when several tenants have due work, the
-- room the probes, `rated` and `capped` leave is shared equally among them, so one
-- tenant's backlog cannot hold back another's deliveries beyond a claim.
-- `tenant_walk` visits the tenants with pending deliveries in descending id order,
-- round-robin from $9 (past the lowest, back to the highest), one descent of
-- deliveries_tenant_due_idx each (schema/018), and a second for a tenant whose latest
-- pending delivery is not due yet. It stops after as many tenants as there is room (at
-- least 2): a claim of N rows costs about N probes whatever the number of tenants.
-- `fair_shares`: the due tenants it found, live and not disabled, the first min(their
-- number, room) of them; each gets room / that many, the remainder one more each to the
-- first in walk order (equal shares; exact, so no row is locked beyond the room).
-- With fewer than two such tenants nothing is shared: the common case (one tenant, or
-- one with due work) costs the walk's two or three descents and claims as before.
-- (One with due work among many with work due later costs the walk bounded by the room.)
-- `fair` takes each tenant's share in due order (its range of the same index, stopping at
-- the share), from the destinations the plain scans claim from. What it leaves (a tenant
-- with fewer due rows than its share) goes to the plain scans, in due order across
-- tenants: the claim stays work conserving. The first-attempt reserve ($3) applies to
-- that remainder. The plain scans walk past the rows `fair` took (they are locked by this
-- transaction, which SKIP LOCKED does not skip).
-- The deliveries of a disabled tenant, and of one with a max_in_flight or a rate_limit of
-- its own, are claimed by no branch here (`set_aside_tenants`): the limited ones are
-- claimed by claim_limited_tenants.sql, the statement before this one, within their
-- limits (docs/decisions/0029), and $2 is what that left. A deleted tenant's destinations
-- are deleted with it (tenant_delete.sql).
-- The event is found by (id, created_at): a delivery's created_at is its event's
-- (enqueue_events.sql writes both with one now(); replays and moves copy it), and events
-- is partitioned by created_at (schema/026), so run-time pruning reads one partition's
-- primary key per claimed row instead of every partition's (tests/test_partition_plan.py).
WITH RECURSIVE set_aside_tenants AS (
    -- tenants_set_aside_idx (schema/019): one descent, none found in the common case.
    SELECT array(SELECT id FROM tenants
                  WHERE (disabled OR max_in_flight IS NOT NULL OR rate_limit IS NOT NULL)
                    AND deleted_at IS NULL) AS ids
), probed_destinations AS (
    UPDATE destinations dest
       SET breaker = 'half_open',
           paused_until = clock_timestamp() + make_interval(secs => $4 / 1000.0)
      FROM (SELECT id FROM destinations
             WHERE breaker <> 'closed' AND paused_until <= now()
               AND NOT disabled AND NOT paused AND deleted_at IS NULL
               AND tenant_id <> ALL ((SELECT ids FROM set_aside_tenants)::bigint[])
               AND EXISTS (SELECT 1 FROM (SELECT 1 FROM deliveries d
                                           WHERE d.destination_id = destinations.id
                                             AND d.status = 'pending'
                                             AND d.next_attempt_at <= now()
                                           ORDER BY d.next_attempt_at DESC
                                           LIMIT 1) due)
             ORDER BY paused_until
             LIMIT least(5, $2)
               FOR NO KEY UPDATE SKIP LOCKED) due
     WHERE dest.id = due.id
 RETURNING dest.id
), probe AS (
    SELECT p.id
      FROM probed_destinations pd
     CROSS JOIN LATERAL (
           SELECT d.id FROM claimable_deliveries d
            WHERE d.destination_id = pd.id
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at
            LIMIT 1
              FOR UPDATE OF d SKIP LOCKED) p
), rated_pick AS (
    -- Rate-limited destinations take their deliveries only here: at most the tokens
    -- take_rate_tokens.sql took for them ($7/$8), and, if also capped, at most the room
    -- under max_in_flight (only while this transaction holds their capped lock, $5).
    -- Kept apart from `capped` and the plain scans (which skip rate_limit rows) so either
    -- path can change without the other.
    SELECT r.destination_id, c.id, c.next_attempt_at
      FROM unnest($7::bigint[], $8::int[]) AS r(destination_id, tokens)
      JOIN destinations dest ON dest.id = r.destination_id
                            AND dest.tenant_id <> ALL ((SELECT ids FROM set_aside_tenants)::bigint[])
     CROSS JOIN LATERAL (
           SELECT d.id, d.next_attempt_at FROM claimable_deliveries d
            WHERE d.destination_id = dest.id
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at
            LIMIT CASE WHEN dest.max_in_flight IS NULL THEN r.tokens
                       WHEN dest.id = ANY ($5::bigint[]) THEN greatest(0, least(r.tokens,
                            dest.max_in_flight - dest.in_flight))
                       ELSE 0 END
              FOR UPDATE OF d SKIP LOCKED) c
), rated AS (
    SELECT destination_id, id, next_attempt_at FROM rated_pick
     ORDER BY next_attempt_at
     LIMIT $2 - (SELECT count(*) FROM probe)
), rate_tokens_returned AS (
    -- Send times booked but not used (fewer due deliveries, the batch full) go back: the
    -- next send time moves back 1/rate for each, to just after the last one used. The row
    -- was updated by this transaction's take_rate_tokens.sql, which still holds it, so
    -- this snapshot sees its current version. A row is updated once per statement, so the
    -- slots of a destination both rated and capped ($5) are taken here too, and
    -- `slots_taken` leaves it alone (else its unused send times could not go back).
    UPDATE destinations dest
       SET rate_next_send_at = dest.rate_next_send_at
                               - make_interval(secs => (r.tokens - r.used) / dest.rate_limit),
           in_flight = dest.in_flight
                       + CASE WHEN dest.id = ANY ($5::bigint[]) THEN r.used ELSE 0 END
      FROM (SELECT t.destination_id, t.tokens,
                   (SELECT count(*) FROM rated x WHERE x.destination_id = t.destination_id)
                       AS used
              FROM unnest($7::bigint[], $8::int[]) AS t(destination_id, tokens)) r
     WHERE dest.id = r.destination_id
       AND (r.used < r.tokens OR (r.used > 0 AND dest.id = ANY ($5::bigint[])))
), room AS (
    SELECT $2 - count(*) - (SELECT count(*) FROM rated) AS n FROM probe
), capped AS (
    SELECT c.id, c.next_attempt_at
      FROM destinations dest
     CROSS JOIN LATERAL (
           SELECT d.id, d.next_attempt_at FROM claimable_deliveries d
            WHERE d.destination_id = dest.id
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at
            LIMIT greatest(0, least((SELECT n FROM room), dest.max_in_flight - dest.in_flight))
              FOR UPDATE OF d SKIP LOCKED) c
     WHERE dest.id = ANY ($5::bigint[])
       AND dest.id <> ALL ($6::bigint[])
       AND dest.max_in_flight IS NOT NULL
       AND dest.rate_limit IS NULL  -- those are claimed through `rated`
       AND NOT dest.disabled AND NOT dest.paused AND dest.deleted_at IS NULL
       AND dest.breaker = 'closed'
       AND dest.tenant_id <> ALL ((SELECT ids FROM set_aside_tenants)::bigint[])
), fair_room AS (
    SELECT greatest(0, (SELECT n FROM room) - (SELECT count(*) FROM capped)) AS n
), tenant_walk AS (
    -- The next tenant with pending deliveries below the one visited last: in the first lap
    -- those below $9, in the second (from the highest id down) those from $9 up. Each
    -- descent lands on the tenant's latest pending delivery: the live end of its range.
    -- Its earliest ones are what claims take first, and their index entries stay behind,
    -- dead, until a vacuum: a walk upward, landing there, stepped over all of them on
    -- every claim (docs/decisions/0026). The bound is in the index condition, not a
    -- filter: a filter would read the whole range.
    SELECT next.tenant_id, next.last_pending_at, next.lap, 1 AS visited
      FROM ((SELECT d.tenant_id, d.next_attempt_at AS last_pending_at, 1 AS lap
               FROM deliveries d
              WHERE d.status = 'pending' AND d.tenant_id < $9
              ORDER BY d.tenant_id DESC, d.next_attempt_at DESC
              LIMIT 1)
            UNION ALL
            (SELECT d.tenant_id, d.next_attempt_at, 2
               FROM deliveries d
              WHERE d.status = 'pending' AND d.tenant_id >= $9
              ORDER BY d.tenant_id DESC, d.next_attempt_at DESC
              LIMIT 1)
            LIMIT 1) next
     WHERE (SELECT n FROM fair_room) > 0
    UNION ALL
    SELECT next.tenant_id, next.last_pending_at, next.lap, walked.visited + 1
      FROM tenant_walk walked
     CROSS JOIN LATERAL (
           (SELECT d.tenant_id, d.next_attempt_at AS last_pending_at, walked.lap AS lap
              FROM deliveries d
             WHERE d.status = 'pending' AND d.tenant_id < walked.tenant_id
               AND d.tenant_id >= CASE WHEN walked.lap = 1 THEN 0 ELSE $9 END
             ORDER BY d.tenant_id DESC, d.next_attempt_at DESC
             LIMIT 1)
           UNION ALL
           (SELECT d.tenant_id, d.next_attempt_at, 2
              FROM deliveries d
             WHERE walked.lap = 1 AND d.status = 'pending' AND d.tenant_id >= $9
             ORDER BY d.tenant_id DESC, d.next_attempt_at DESC
             LIMIT 1)
           LIMIT 1) next
     WHERE walked.visited < greatest(2, (SELECT n FROM fair_room))
), walked_due AS (
    -- Due: its latest pending delivery is, or else one probe down from now() (again not
    -- from the dead end of the range).
    SELECT w.tenant_id, row_number() OVER (ORDER BY w.visited) AS k,
           count(*) OVER () AS due_tenants
      FROM tenant_walk w
      JOIN tenants t ON t.id = w.tenant_id
     WHERE NOT t.disabled AND t.deleted_at IS NULL
       AND t.max_in_flight IS NULL AND t.rate_limit IS NULL
       AND (w.last_pending_at <= now()
            OR EXISTS (SELECT 1 FROM (SELECT 1 FROM deliveries d
                                       WHERE d.status = 'pending'
                                         AND d.tenant_id = w.tenant_id
                                         AND d.next_attempt_at <= now()
                                       ORDER BY d.next_attempt_at DESC
                                       LIMIT 1) due))
), fair_shares AS (
    SELECT s.tenant_id, s.k,
           r.n / s.served + CASE WHEN s.k <= r.n % s.served THEN 1 ELSE 0 END AS share
      FROM (SELECT tenant_id, k, least(due_tenants, (SELECT n FROM fair_room)) AS served
              FROM walked_due
             WHERE due_tenants >= 2) s,
           fair_room r
     WHERE s.k <= s.served
), fair AS (
    SELECT f.id, f.next_attempt_at
      FROM fair_shares s
     CROSS JOIN LATERAL (
           SELECT d.id, d.next_attempt_at
             FROM claimable_deliveries d
             JOIN destinations dest ON dest.id = d.destination_id
            WHERE d.tenant_id = s.tenant_id
              AND d.next_attempt_at <= now()
              AND NOT dest.disabled AND NOT dest.paused AND dest.deleted_at IS NULL
              AND dest.breaker = 'closed'
              AND dest.max_in_flight IS NULL
              AND dest.rate_limit IS NULL
              AND d.destination_id <> ALL ($6::bigint[])
            ORDER BY d.next_attempt_at
            LIMIT s.share
              FOR UPDATE OF d SKIP LOCKED) f
), plain_room AS (
    SELECT (SELECT n FROM fair_room) - (SELECT count(*) FROM fair) AS n,
           array(SELECT id FROM fair) AS fair_ids
), uncapped_due AS (
    -- Whether any destination the plain scans may claim from has due work. The scans
    -- below walk deliveries_claimable_idx in due order and drop the rows of capped and
    -- rate-limited destinations after the join; with a backlog that is all capped they
    -- would walk every due row to find none. This probe stops at the first uncapped
    -- destination with a due delivery (deliveries_destination_idx), and the scans are
    -- skipped when there is none (docs/decisions/0025). Each destination's probe, here
    -- and in probed_destinations, is a subquery with LIMIT (not flattened into a join)
    -- descending from now() to its newest due row: as a plain EXISTS it was planned as a
    -- hash semi-join over a sequential scan of deliveries, whose heap front is the rows
    -- claimed since the last vacuum, or as a forward scan stepping over their index
    -- entries; on every claim (docs/decisions/0038).
    SELECT EXISTS (
           SELECT 1 FROM destinations dest
            WHERE dest.max_in_flight IS NULL AND dest.rate_limit IS NULL
              AND NOT dest.disabled AND NOT dest.paused AND dest.deleted_at IS NULL
              AND dest.breaker = 'closed'
              AND dest.id <> ALL ($6::bigint[])
              AND dest.tenant_id <> ALL ((SELECT ids FROM set_aside_tenants)::bigint[])
              AND EXISTS (SELECT 1 FROM (SELECT 1 FROM deliveries d
                                          WHERE d.destination_id = dest.id
                                            AND d.status = 'pending'
                                            AND d.next_attempt_at <= now()
                                          ORDER BY d.next_attempt_at DESC
                                          LIMIT 1) due)) AS found
), eligible_first AS (
    SELECT d.id, d.next_attempt_at
      FROM claimable_deliveries d
      JOIN destinations dest ON dest.id = d.destination_id
     WHERE least(d.attempt, 1) = 0
       AND d.next_attempt_at <= now()
       AND NOT dest.disabled AND NOT dest.paused AND dest.deleted_at IS NULL
       AND dest.breaker = 'closed'
       AND dest.max_in_flight IS NULL
       AND dest.rate_limit IS NULL
       AND d.destination_id <> ALL ($6::bigint[])
       AND dest.tenant_id <> ALL ((SELECT ids FROM set_aside_tenants)::bigint[])
       AND d.id <> ALL ((SELECT fair_ids FROM plain_room)::bigint[])
       AND (SELECT found FROM uncapped_due)
     ORDER BY d.next_attempt_at
     -- What `capped` and `fair` took comes first in `chosen`: rows locked here beyond the
     -- room they leave would stay locked until we commit without being claimed, and every
     -- other claimer would skip them (docs/decisions/0025).
     LIMIT greatest(0, (SELECT n FROM plain_room))
       FOR UPDATE OF d SKIP LOCKED
), eligible_retry AS (
    SELECT d.id, d.next_attempt_at
      FROM claimable_deliveries d
      JOIN destinations dest ON dest.id = d.destination_id
     WHERE least(d.attempt, 1) = 1
       AND d.next_attempt_at <= now()
       AND NOT dest.disabled AND NOT dest.paused AND dest.deleted_at IS NULL
       AND dest.breaker = 'closed'
       AND dest.max_in_flight IS NULL
       AND dest.rate_limit IS NULL
       AND d.destination_id <> ALL ($6::bigint[])
       AND dest.tenant_id <> ALL ((SELECT ids FROM set_aside_tenants)::bigint[])
       AND d.id <> ALL ((SELECT fair_ids FROM plain_room)::bigint[])
       AND (SELECT found FROM uncapped_due)
     ORDER BY d.next_attempt_at
     LIMIT greatest(0, (SELECT n FROM plain_room)
                         - least($3, (SELECT count(*) FROM eligible_first)))
       FOR UPDATE OF d SKIP LOCKED
), chosen AS (
    SELECT id FROM probe
    UNION ALL
    SELECT id FROM rated
    UNION ALL
    (SELECT id FROM capped ORDER BY next_attempt_at LIMIT (SELECT n FROM room))
    UNION ALL
    SELECT id FROM fair
    UNION ALL
    SELECT id FROM eligible_retry
    UNION ALL
    (SELECT id FROM eligible_first
      ORDER BY next_attempt_at
      LIMIT greatest(0, (SELECT n FROM plain_room) - (SELECT count(*) FROM eligible_retry)))
), claimed AS (
    UPDATE deliveries d
       SET status = 'in_flight',
           attempt = d.attempt + 1,
           locked_by = $1,
           locked_until = clock_timestamp() + make_interval(secs => $4 / 1000.0),
           claim_token = (SELECT nextval('claim_token_seq')),
           holds_slot = d.destination_id = ANY ($5::bigint[])
     WHERE d.id = ANY (ARRAY(SELECT id FROM chosen))
 RETURNING d.id, d.event_id, d.destination_id, d.attempt, d.holds_slot, d.claim_token,
           d.created_at
), slots_taken AS (
    UPDATE destinations dest
       SET in_flight = dest.in_flight + t.n
      FROM (SELECT destination_id, count(*) AS n FROM claimed
             WHERE holds_slot
               AND destination_id <> ALL ($7::bigint[])  -- rate_tokens_returned's
             GROUP BY destination_id) t
     WHERE dest.id = t.destination_id
)
SELECT c.id, c.event_id, c.destination_id, c.attempt,
       CASE WHEN c.id = taken.first_id THEN dest.url END AS url,
       CASE WHEN c.id = taken.first_id THEN dest.timeout_ms END AS timeout_ms,
       CASE WHEN c.id <> taken.first_id THEN NULL
            WHEN dest.previous_secret IS NOT NULL AND dest.previous_secret_until > now()
            THEN ARRAY[dest.secret, dest.previous_secret]
            ELSE ARRAY[dest.secret] END AS secrets,
       ev.payload,
       CASE WHEN c.id = taken.first_id THEN dest.max_in_flight END AS max_in_flight,
       CASE WHEN c.id = taken.first_id THEN dest.headers END AS headers,
       CASE WHEN c.id = taken.first_id THEN dest.retry_schedule END AS retry_schedule,
       CASE WHEN c.id = taken.first_id THEN dest.rate_limit END AS rate_limit,
       CASE WHEN c.id = taken.first_id THEN dest.egress_revision END AS egress_revision,
       ev.traceparent,
       CASE WHEN c.id = taken.first_id THEN dest.propagate_trace END AS propagate_trace,
       CASE WHEN c.id = taken.first_id THEN dest.tenant_id END AS tenant_id,
       c.claim_token,
       -- Full after this claim (`dest` is the row as the statement began, before
       -- slots_taken): the worker then gives these slots back within milliseconds.
       coalesce(dest.in_flight + nullif(taken.n, 0) >= dest.max_in_flight, false) AS fills_cap,
       c.holds_slot,
       (SELECT tenant_id FROM fair_shares ORDER BY k DESC LIMIT 1) AS tenant_cursor
  FROM claimed c
  JOIN destinations dest ON dest.id = c.destination_id
 CROSS JOIN LATERAL (
       -- LIMIT keeps the subquery from being flattened into a join the planner may make
       -- a merge join over every partition's index; as a parameterized scan it is pruned
       -- at run time to the one partition (tests/test_partition_plan.py).
       SELECT e.payload, e.traceparent FROM events e
        WHERE e.id = c.event_id AND e.created_at = c.created_at
        LIMIT 1) ev
  JOIN (SELECT destination_id, min(id) AS first_id, count(*) FILTER (WHERE holds_slot) AS n
          FROM claimed GROUP BY destination_id) taken
    ON taken.destination_id = c.destination_id

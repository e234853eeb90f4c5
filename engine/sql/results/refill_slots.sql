-- refill_slots: hand the slots a worker's successful results just gave back under capped
-- destinations' max_in_flight straight back to it, with their next due deliveries, in the
-- transaction of record_results.sql (the statement before this one), and claim spares.
--   $1 worker_id text, $2 lease_ms int,
--   $3 destination ids bigint[], $4 slots int[]: at most this many for each (the
--      successes of that destination in the batch), $5 spares int[]: and this many more
--      that take no slot
--
-- Why: with a binding cap, a freed slot otherwise waited for the result write to commit,
-- its notification, the claim loop's wake-up and a claim that locks the destination again
-- (docs/decisions/0015-capped-slots-refilled-by-the-result-write.md). Here the answer's
-- own write claims the next delivery: one round trip, no wake-up.
--
-- Exact across processes and hosts as the claim is (lock_capped_destinations.sql): only
-- destinations whose advisory lock this transaction holds from record_results.sql get
-- slots, and this statement's snapshot is taken after that lock, so `in_flight` is
-- the counter as the previous holder committed it and nobody changes it until we commit.
-- Which ones those are: the rows record_results.sql's `breaker` UPDATE wrote, which are
-- exactly those it locked; a row this transaction wrote has our transaction id as xmin.
-- (xmin is a 32-bit xid, pg_current_xact_id() its 64-bit form: compared modulo 2^32.)
-- A result that changed nothing (reaped or released meanwhile) took no lock, and its
-- destination gets no slot here: the claim loop takes it as before. The deliveries come
-- from claimable_deliveries (schema/015), as the claim's do.
--
-- Spares (holds_slot false) are claimed deliveries the worker does not send yet: when
-- one of its requests to that destination is answered with a success, it sends a spare
-- at once, and the result hands the slot on to it (record_results.sql, `handed`). They
-- need no lock, since they leave the counter alone, and they come after the slot
-- takers in due order (`numbered`). FOR UPDATE is not allowed beside a window function,
-- so the rows are numbered outside the locking scan.
--
-- Only healthy destinations: the breaker closed (this snapshot sees what the batch did to
-- it), not disabled, paused or deleted, nor of a disabled tenant, and not rate-limited (their sends are booked by
-- take_rate_tokens.sql in the claim). Ordering keys are kept as in claim_batch.sql.
-- The event is found by (id, created_at): a delivery's created_at is its event's
-- (enqueue_events.sql writes both with one now(); replays and moves copy it), and events
-- is partitioned by created_at (schema/026), so run-time pruning reads one partition's
-- primary key per claimed row instead of every partition's (tests/test_partition_plan.py).
WITH wanted AS (
    SELECT w.destination_id, w.slots, w.spares
      FROM unnest($3::bigint[], $4::int[], $5::int[]) AS w(destination_id, slots, spares)
), picked AS (
    SELECT c.id, c.next_attempt_at, dest.id AS destination_id, room.n AS room
      FROM wanted w
      JOIN destinations dest ON dest.id = w.destination_id
     CROSS JOIN LATERAL (
           SELECT CASE WHEN dest.xmin::text
                            = (pg_current_xact_id()::text::numeric % 4294967296)::text
                       THEN greatest(0, least(w.slots, dest.max_in_flight - dest.in_flight))
                       ELSE 0 END AS n) room
     CROSS JOIN LATERAL (
           SELECT d.id, d.next_attempt_at FROM claimable_deliveries d
            WHERE d.destination_id = dest.id
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at
            LIMIT room.n + greatest(0, w.spares)
              FOR UPDATE OF d SKIP LOCKED) c
     WHERE dest.max_in_flight IS NOT NULL
       AND dest.rate_limit IS NULL
       AND NOT dest.disabled AND NOT dest.paused AND dest.deleted_at IS NULL
       -- not of a disabled tenant, nor of one with limits of its own, whose slots only
       -- claim_limited_tenants.sql takes (tenants_set_aside_idx: one descent, none found)
       AND dest.tenant_id <> ALL (ARRAY(SELECT id FROM tenants
                    WHERE (disabled OR max_in_flight IS NOT NULL OR rate_limit IS NOT NULL)
                      AND deleted_at IS NULL))
       AND dest.breaker = 'closed'
), numbered AS (
    SELECT id, row_number() OVER (PARTITION BY destination_id
                                  ORDER BY next_attempt_at, id) <= room AS takes_slot
      FROM picked
), claimed AS (
    UPDATE deliveries d
       SET status = 'in_flight',
           attempt = d.attempt + 1,
           locked_by = $1,
           locked_until = clock_timestamp() + make_interval(secs => $2 / 1000.0),
           claim_token = (SELECT nextval('claim_token_seq')),
           holds_slot = d.id = ANY (ARRAY(SELECT id FROM numbered WHERE takes_slot))
     WHERE d.id = ANY (ARRAY(SELECT id FROM picked))
 RETURNING d.id, d.event_id, d.destination_id, d.attempt, d.claim_token, d.holds_slot,
           d.created_at
), taken AS (
    SELECT destination_id, count(*) FILTER (WHERE holds_slot) AS n, min(id) AS first_id
      FROM claimed GROUP BY destination_id
), slots_taken AS (
    UPDATE destinations dest
       SET in_flight = dest.in_flight + t.n
      FROM taken t
     WHERE dest.id = t.destination_id AND t.n > 0
)
-- The columns of claim_batch.sql, in its order (engine.domain.Claim), the destination's
-- on the first row of each destination only, as there.
SELECT c.id, c.event_id, c.destination_id, c.attempt,
       CASE WHEN c.id = t.first_id THEN dest.url END AS url,
       CASE WHEN c.id = t.first_id THEN dest.timeout_ms END AS timeout_ms,
       CASE WHEN c.id <> t.first_id THEN NULL
            WHEN dest.previous_secret IS NOT NULL AND dest.previous_secret_until > now()
            THEN ARRAY[dest.secret, dest.previous_secret]
            ELSE ARRAY[dest.secret] END AS secrets,
       ev.payload,
       CASE WHEN c.id = t.first_id THEN dest.max_in_flight END AS max_in_flight,
       CASE WHEN c.id = t.first_id THEN dest.headers END AS headers,
       CASE WHEN c.id = t.first_id THEN dest.retry_schedule END AS retry_schedule,
       CASE WHEN c.id = t.first_id THEN dest.rate_limit END AS rate_limit,
       CASE WHEN c.id = t.first_id THEN dest.egress_revision END AS egress_revision,
       ev.traceparent,
       CASE WHEN c.id = t.first_id THEN dest.propagate_trace END AS propagate_trace,
       CASE WHEN c.id = t.first_id THEN dest.tenant_id END AS tenant_id,
       c.claim_token,
       c.holds_slot AND dest.in_flight + t.n >= dest.max_in_flight AS fills_cap,
       c.holds_slot
  FROM claimed c
  JOIN taken t ON t.destination_id = c.destination_id
  JOIN destinations dest ON dest.id = c.destination_id
 CROSS JOIN LATERAL (
       -- LIMIT keeps the subquery from being flattened into a join the planner may make
       -- a merge join over every partition's index; as a parameterized scan it is pruned
       -- at run time to the one partition (tests/test_partition_plan.py).
       SELECT e.payload, e.traceparent FROM events e
        WHERE e.id = c.event_id AND e.created_at = c.created_at
        LIMIT 1) ev

-- take_rate_tokens: the first statement of a claim transaction, with
-- lock_capped_destinations.sql. Books send times for rate-limited destinations with due
-- work: each token is one request's send time, the destination's tokens 1/rate apart.
--   $1 limit int: the most tokens one claim takes from one destination
--   $2 destination ids bigint[] the worker wants none of now (claim_batch.sql's $6)
-- Returns (destination id, tokens taken, first send time, statement time); claim_batch.sql
-- (`rated`, its $7/$8) claims at most that many of each destination's deliveries and gives
-- back what it could not use, on the row this transaction still holds. The claim's k-th
-- delivery of a destination (from 0) may be sent at first send time + k / rate_limit, and
-- the worker holds it until then (engine/db/queue.py assigns the times, engine/worker/send_pacing.py
-- keeps them).
--
-- Why a schedule of send times, not a bucket spent at claim time: what the receiver sees
-- are the sends, and a claim is sent later by a varying amount (new connections, a busy
-- event loop, a worker's `ready` queue). With a bucket of one second's worth, a burst sent
-- late next to claims sent at once exceeded the bound (rate x 10 + one burst of the rate
-- in any 10 s window; see schema/012_rate_send_schedule.sql). Send times 1/rate apart
-- with no burst at all put at most rate x 10 (+1) of them in any 10 s window, which leaves
-- (rate - 1) / rate of a second for a send's lateness before the bound is reached.
-- Why book up to a second ahead: the claim that books a destination's next second does
-- not have to come exactly when a send falls due. Workers claim again within half a second
-- while they serve a limited destination (engine/worker/claim_policy.py, rate_limited),
-- so the schedule never runs dry while there is backlog and the limit is used fully; a
-- destination booked a second ahead is not touched (no lock, no write).
-- Why the state lives in the destination row: the limit holds across processes and hosts
-- with nothing but the database, whose clock every claimer shares, and the state is one
-- column on a row the claim reads anyway.
-- Why SKIP LOCKED on the destination row: a claimer booking one destination makes the
-- others skip only that destination, for the length of its claim; nothing else waits
-- (rate-limited rows leave the plain scans of claim_batch.sql, so no claimer can send them
-- without a booking). The row lock is held until the claim commits, which is what makes
-- the booking and the give-back exact. A row locked after another claim committed is read
-- at its new version, so the next send time only moves forward: no two booked sends of a
-- destination are closer than 1/rate.
-- statement_timestamp(), not now(): a transaction that began earlier must not book sends
-- for a moment already past when it runs.
-- Why the earliest next send time first, 32 at most: with many limited destinations each
-- claim serves those that waited longest, so none is starved.
-- Held-back deliveries stay `pending` and untouched: no attempt, no breaker count.
WITH due AS (
    SELECT dest.id, dest.rate_limit,
           greatest(dest.rate_next_send_at, statement_timestamp()) AS first_send_at
      FROM destinations dest
     WHERE dest.rate_limit IS NOT NULL
       AND NOT dest.disabled AND NOT dest.paused AND dest.deleted_at IS NULL
       -- not of a disabled tenant, nor of one with limits of its own: claim_limited_tenants.sql
       -- books those (tenants_set_aside_idx: one descent, none found)
       AND dest.tenant_id <> ALL (ARRAY(SELECT id FROM tenants
                    WHERE (disabled OR max_in_flight IS NOT NULL OR rate_limit IS NOT NULL)
                      AND deleted_at IS NULL))
       AND dest.breaker = 'closed'
       AND dest.id <> ALL ($2::bigint[])
       AND (dest.rate_next_send_at IS NULL
            OR dest.rate_next_send_at <= statement_timestamp() + interval '1 second')
       -- One probe of deliveries_destination_idx per destination, never a semi-join
       -- against the due backlog (lock_capped_destinations.sql says why).
       AND EXISTS (SELECT 1 FROM (SELECT 1 FROM deliveries d
                                   WHERE d.destination_id = dest.id
                                     AND d.status = 'pending'
                                     AND d.next_attempt_at <= now()
                                   ORDER BY d.next_attempt_at DESC
                                   LIMIT 1) due)
     ORDER BY dest.rate_next_send_at NULLS FIRST
     LIMIT 32
       FOR NO KEY UPDATE OF dest SKIP LOCKED
), taken AS (
    -- Every send time from the first to a second from now (at least the first).
    SELECT id, rate_limit, first_send_at,
           least($1, 1 + floor(rate_limit * extract(epoch FROM
               statement_timestamp() + interval '1 second' - first_send_at)))::int AS n
      FROM due
)
UPDATE destinations dest
   SET rate_next_send_at = t.first_send_at + make_interval(secs => t.n / t.rate_limit)
  FROM taken t
 WHERE dest.id = t.id
RETURNING dest.id, t.n, t.first_send_at, statement_timestamp()

-- take_rate_tokens: the first statement of a claim transaction, with
-- lock_capped_destinations.sql. Refills the token bucket of rate-limited destinations with
-- due work and takes what the claim may send to each now.
--   $1 limit int: the most tokens one claim takes from one destination
--   $2 destination ids bigint[] the worker wants none of now (claim_batch.sql's $6)
-- Returns (destination id, tokens taken); claim_batch.sql (`rated`, its $7/$8) claims at
-- most that many of each destination's deliveries and gives back what it could not use,
-- on the row this transaction still holds.
--
-- Why a token bucket in the destination row: the limit holds across processes and hosts
-- with nothing but the database, whose clock (now()) every claimer shares, and the state
-- is two columns on a row the claim reads anyway. The bucket holds at most one second's
-- worth (rate_limit tokens, but at least one: a request is not divisible), so over any
-- window of T seconds a destination is sent at most rate * T plus one burst of the rate
-- (after it was idle). It starts empty, not full: what the receiver sees is the claims
-- shifted by their send latency, and a first batch sent late (new connections) would
-- otherwise crowd a window with a full burst plus the refill. A full bucket refills in a
-- second, and workers claim at least that often while there is backlog (the worker schedules its
-- next claim for when tokens are due), so a limit with backlog is used fully.
-- Why SKIP LOCKED on the destination row: a claimer spending one destination's tokens
-- makes the others skip only that destination, for the length of its claim; nothing else
-- waits (rate-limited rows leave the plain scans of claim_batch.sql, so no claimer can
-- send them without tokens). The row lock is held until the claim commits, which is what
-- makes the take and the give-back exact.
-- statement_timestamp(), not now(): a transaction that began before the previous holder's
-- refill must not count that time again (and greatest() never moves the clock back).
-- Why the least recently refilled first, 32 at most: with many limited destinations each
-- claim serves those that waited longest, so none is starved.
-- Held-back deliveries stay `pending` and untouched: no attempt, no breaker count.
WITH due AS (
    SELECT dest.id,
           least(greatest(dest.rate_limit, 1),
                 coalesce(dest.rate_tokens, 0)
                 + dest.rate_limit * greatest(0, extract(epoch FROM statement_timestamp()
                                                 - dest.rate_refilled_at))) AS tokens,
           dest.rate_refilled_at IS NULL AS unstarted
      FROM destinations dest
     WHERE dest.rate_limit IS NOT NULL
       AND NOT dest.disabled AND NOT dest.paused AND dest.deleted_at IS NULL
       AND dest.breaker = 'closed'
       AND dest.id <> ALL ($2::bigint[])
       AND EXISTS (SELECT 1 FROM deliveries d
                    WHERE d.destination_id = dest.id AND d.status = 'pending'
                      AND d.next_attempt_at <= now())
     ORDER BY dest.rate_refilled_at NULLS FIRST
     LIMIT 32
       FOR NO KEY UPDATE OF dest SKIP LOCKED
), taken AS (
    -- A bucket without a whole token is left alone (no write), unless it is new: then its
    -- clock starts now.
    SELECT id, tokens, least(floor(tokens), $1)::int AS n FROM due
     WHERE tokens >= 1 OR unstarted
)
UPDATE destinations dest
   SET rate_tokens = t.tokens - t.n,
       rate_refilled_at = greatest(dest.rate_refilled_at, statement_timestamp())
  FROM taken t
 WHERE dest.id = t.id
RETURNING dest.id, t.n

-- rate_limit becomes a send schedule instead of a token bucket: each claim books its
-- rate-limited deliveries consecutive send times 1/rate apart, and the destination row
-- keeps the next free one (engine/sql/claim/take_rate_tokens.sql).
--
-- Why: the bucket was spent at claim time, but what the receiver sees are the sends, and a
-- claim is sent later by a varying amount (new connections, a busy event loop, a worker's
-- `ready` queue). A full bucket of one second's worth left no room for that: a burst sent
-- 0.4 s late next to claims sent at once put 228 requests in a 10 s window at rate 20
-- (bound: rate x 10 + one burst of the rate = 220). With send times spaced 1/rate apart
-- and no burst, the bound leaves (rate - 1) / rate of a second for that lateness.
--
-- rate_next_send_at: the earliest time the destination's next request may go (NULL: no
-- request yet); a time in the past means "now". Claims book at most a second ahead of it.
-- Old bucket values carry no meaning in the schedule and are dropped; the last refill time
-- is a moment in the past, which is what the schedule reads as "free now".
ALTER TABLE destinations DROP COLUMN rate_tokens;
ALTER TABLE destinations RENAME COLUMN rate_refilled_at TO rate_next_send_at;

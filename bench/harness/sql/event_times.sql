-- event_times: when each event of a range was committed, as unix milliseconds, for
-- end-to-end latency against the fake destination's arrival clock. created_at is now() of
-- the ingress transaction, which commits a few ms later: end-to-end is slightly overstated.
--   $1 first event id (exclusive) bigint, $2 last event id bigint
SELECT id, (extract(epoch FROM created_at) * 1000)::bigint FROM events
 WHERE id > $1 AND id <= $2

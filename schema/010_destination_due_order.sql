-- deliveries_destination_idx gains next_attempt_at as a third key: (destination_id,
-- status, next_attempt_at).
--
-- A capped or rate-limited destination's deliveries are claimed per destination, the due
-- ones in next_attempt_at order, at most the room under its cap (claim_batch.sql, `capped`
-- and `rated_pick`). With (destination_id, status) alone the scan read every pending row
-- of the destination and sorted them to take the first few: a destination capped at 5
-- with 100 pending cost 100 heap fetches and a sort per claim (5 ms of an 8 ms claim in
-- bench capped-slow), and with a backlog of 100,000 it would have cost 100,000. With the
-- third key the scan comes out in order and stops at the LIMIT.
--
-- Replaced, not added: every query that used the two keys uses them as the prefix of the
-- three, and one more index would be one more entry to write on every claim and result
-- (status is indexed, so those updates are never HOT).
DROP INDEX deliveries_destination_idx;
CREATE INDEX deliveries_destination_idx ON deliveries (destination_id, status, next_attempt_at);

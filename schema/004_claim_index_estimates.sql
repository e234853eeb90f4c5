-- deliveries_claimable_idx, same name and purpose, keyed on least(attempt, 1) (0: first
-- attempt, 1: retry) instead of the boolean (attempt = 0).
--
-- Why: the claim orders each branch by next_attempt_at and takes the first $limit rows.
-- That is cheap only as an ordered scan of this index; the planner picks it when it
-- expects more matching rows than the limit. With the boolean key it estimated the
-- branches from the statistics of `attempt`, and so
--   * with no retries pending (a healthy queue), it predicted one retry and drove the
--     retry branch from the destinations instead, reading every pending delivery of every
--     destination: 0.5 s per claim with 200,000 pending;
--   * with statistics older than a burst (autovacuum analyzes up to a minute later), it
--     predicted no first attempts and sorted the whole burst on every claim.
-- PostgreSQL keeps no statistics for the expressions of a partial index, so for
-- `least(attempt, 1) = 0` it uses its default equality estimate, a fixed share of the
-- table's current size: ordered scans once the queue is large, whatever ANALYZE last saw,
-- and a bitmap read of the (small) due range plus a sort while it is small.
-- tests/test_claim_plan.py covers all three situations.
DROP INDEX deliveries_claimable_idx;
CREATE INDEX deliveries_claimable_idx ON deliveries (least(attempt, 1), next_attempt_at)
    WHERE status = 'pending';

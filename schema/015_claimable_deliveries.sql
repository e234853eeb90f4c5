-- claimable_deliveries: the deliveries a claim may take once due, written once for every
-- statement that claims (engine/sql/claim/claim_batch.sql's five branches, refill_slots.sql):
-- pending, and first in line of their ordering key (no earlier delivery of the same
-- destination and key is still in the queue). Whether one is due (`next_attempt_at <=
-- now()`) stays in each statement: a view binds now() when it is created, and the tests
-- move the clock by putting their own now() first on the search_path.
-- A plain view, which the planner pulls up into each query (FOR UPDATE OF the view locks
-- the delivery row), so every branch keeps its own index scan; tests/test_claim_plan.py
-- checks the plans.
CREATE VIEW claimable_deliveries AS
SELECT d.id, d.destination_id, d.attempt, d.next_attempt_at
  FROM deliveries d
 WHERE d.status = 'pending'
   AND (d.ordering_key IS NULL OR NOT EXISTS (
         SELECT 1 FROM deliveries e
          WHERE e.destination_id = d.destination_id
            AND e.ordering_key = d.ordering_key
            AND e.id < d.id));

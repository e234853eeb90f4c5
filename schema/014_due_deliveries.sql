-- due_deliveries: the deliveries a claim may take, written once for every statement that
-- claims (engine/sql/claim_batch.sql's five branches, refill_slots.sql): pending, due, and
-- first in line of their ordering key (no earlier delivery of the same destination and
-- key is still in the queue). A plain view, which the planner pulls up into each query
-- (FOR UPDATE OF the view locks the delivery row), so every branch keeps its own index
-- scan; tests/test_claim_plan.py checks the plans.
CREATE VIEW due_deliveries AS
SELECT d.id, d.destination_id, d.attempt, d.next_attempt_at
  FROM deliveries d
 WHERE d.status = 'pending'
   AND d.next_attempt_at <= now()
   AND (d.ordering_key IS NULL OR NOT EXISTS (
         SELECT 1 FROM deliveries e
          WHERE e.destination_id = d.destination_id
            AND e.ordering_key = d.ordering_key
            AND e.id < d.id));

-- A capped destination's in-flight count as a counter on its row, instead of a count of its
-- in-flight deliveries on every claim (engine/sql/claim/lock_capped_destinations.sql says how the
-- counter stays exact across processes and hosts).
--   destinations.in_flight: deliveries of this destination in flight that hold one of its
--     max_in_flight slots; maintained by claim_batch (up), record_results and return_claims
--     (down), each under the destination's advisory lock.
--   deliveries.holds_slot: whether this delivery's current claim took a slot, so that only
--     those give one back. A cap set or removed while deliveries are in flight then never
--     drives the counter off: claims made without a cap hold no slot. Meaningful only while
--     the delivery is in flight; every claim sets it.
-- Both are metadata-only additions (constant defaults): no table rewrite.
ALTER TABLE destinations ADD COLUMN in_flight integer NOT NULL DEFAULT 0;
ALTER TABLE deliveries ADD COLUMN holds_slot boolean NOT NULL DEFAULT false;

-- Deliveries in flight at upgrade time to a capped destination count against its cap.
UPDATE deliveries d
   SET holds_slot = true
  FROM destinations dest
 WHERE dest.id = d.destination_id AND dest.max_in_flight IS NOT NULL
   AND d.status = 'in_flight';
UPDATE destinations dest
   SET in_flight = f.n
  FROM (SELECT destination_id, count(*) AS n FROM deliveries
         WHERE holds_slot AND status = 'in_flight' GROUP BY destination_id) f
 WHERE dest.id = f.destination_id;

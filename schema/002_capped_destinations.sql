-- Capped destinations (max_in_flight set) are looked up on every claim; this index holds
-- only them, so a deployment without caps pays nothing for the lookup.
CREATE INDEX destinations_capped_idx ON destinations (id) WHERE max_in_flight IS NOT NULL;

-- Indexes for the console's reads (GET /v1/events, GET /v1/deliveries?event_type=&since=
-- &until=): events newest first, all of them or of one type, in a time range, by keyset.
--
-- Why btrees on (created_at, id) and (type, created_at, id): "newest first between two
-- times" is an ordered backward range scan that stops at the page size, whatever the size
-- of the history. events_created_at_idx (BRIN) can only say which block ranges may hold a
-- time, so a page of a range would read and sort every row of it; ids alone do not order
-- events by time exactly (two committer slots allocate ids in overlapping transactions).
-- The cost: two more index entries per accepted event, on the ingress write path.
CREATE INDEX events_created_id_idx ON events (created_at, id);
CREATE INDEX events_type_created_idx ON events (type, created_at, id);

-- Each attempt names its destination, so the console's per-destination figures over a
-- window (GET /v1/overview, GET /v1/destinations/{id}/stats) are one read of the window's
-- attempts (delivery_attempts_started_idx, BRIN) grouped or filtered on this column. Found
-- through the delivery instead, each attempt cost two primary-key probes: 250 ms for one
-- hour at 10 attempts a second. record_results.sql and return_claims.sql fill it; attempts
-- recorded before this migration have none and are not counted per destination (they
-- leave a 24 h window within a day). Nullable without a default: adding it rewrites
-- nothing.
ALTER TABLE delivery_attempts ADD COLUMN destination_id bigint;

-- Dead deliveries newest first, of one destination or of all (console_dead_deliveries.sql).
-- Partial: they hold only dead rows, so the write path pays for them only when a delivery
-- dies.
CREATE INDEX finished_deliveries_dead_id_idx ON finished_deliveries (destination_id, id)
    WHERE status = 'dead';
CREATE INDEX finished_deliveries_dead_all_idx ON finished_deliveries (id)
    WHERE status = 'dead';

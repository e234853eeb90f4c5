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

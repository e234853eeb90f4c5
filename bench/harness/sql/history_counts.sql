-- history_counts: rows of the history tables (each through its parent, every partition) and
-- of the queue, and the ids the history fill wrote up to ($1 last event id, $2 last
-- finished delivery id): the migration keeps every row.
--   $1 last history event id bigint, $2 last history delivery id bigint
SELECT (SELECT count(*) FROM events WHERE id <= $1),
       (SELECT count(*) FROM finished_deliveries WHERE id <= $2),
       (SELECT count(*) FROM delivery_attempts WHERE delivery_id <= $2),
       (SELECT count(*) FROM events WHERE id > $1),
       (SELECT count(*) FROM deliveries)

-- Parts several statements share, each written once (issue 38). Each is inlined by the
-- planner into the statement that uses it (a view; a LANGUAGE sql function of one
-- SELECT, not volatile, not strict), so those statements plan as if it were written out:
-- tests/test_console_plan.py holds them to their indexes.

-- delivery_rows: queued and finished deliveries as one relation, in the columns the API's
-- Delivery takes (engine/ingress/schemas.py), then completed_at (NULL in the hot table).
-- A condition on it reaches each table's own index.
CREATE VIEW delivery_rows AS
SELECT id, event_id, destination_id, status::text AS status, attempt, next_attempt_at,
       last_error, created_at, NULL::timestamptz AS completed_at
  FROM deliveries
 UNION ALL
SELECT id, event_id, destination_id, status::text, attempt, next_attempt_at, last_error,
       created_at, completed_at
  FROM finished_deliveries;

-- keyset_start: where a newest-first page of events, walked by (created_at, id), starts.
-- `after_given`: the request had a cursor, whose event is (cursor_created_at, cursor_id),
-- both NULL when retention has removed it: the page is then empty rather than the first
-- again. `until` (NULL: no bound) and the cursor fold into one start, the lower of the
-- two, because an index scan can start from one key only: given as two conditions, it
-- would start at `until` and filter its way down to the cursor.
CREATE FUNCTION keyset_start(after_given boolean, cursor_created_at timestamptz,
                             cursor_id bigint, until timestamptz)
RETURNS TABLE (created_at timestamptz, id bigint)
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN NOT after_given THEN coalesce(until, 'infinity')
            WHEN cursor_id IS NULL THEN '-infinity'
            ELSE least(cursor_created_at, coalesce(until, 'infinity')) END,
       CASE WHEN NOT after_given THEN 9223372036854775807
            WHEN cursor_id IS NULL THEN 0
            WHEN cursor_created_at <= coalesce(until, 'infinity') THEN cursor_id
            ELSE 9223372036854775807 END
$$;

-- destination_backlog: per destination with a backlog, its pending and in-flight
-- deliveries, through deliveries_destination_idx (destination_id, status). The hot table
-- holds only the backlog, so this is cheap.
CREATE VIEW destination_backlog AS
SELECT destination_id,
       count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'in_flight') AS in_flight
  FROM deliveries
 GROUP BY destination_id;

-- destination_window: per destination, its attempts in the last `window_s` seconds from
-- the per-minute rollup (schema/011), the window widened to whole minutes (every minute
-- it overlaps counts): by outcome, their duration histogram with its extremes, the latest
-- error. The histograms are summed bucket by bucket with the built-in sum(), several
-- times cheaper than the duration_histogram_sum() aggregate over a day of minutes. A
-- condition on destination_id reaches delivery_minutes_destination_idx.
CREATE FUNCTION destination_window(window_s float8)
RETURNS TABLE (destination_id bigint, succeeded bigint, http_error bigint,
               transport_error bigint, durations bigint[], min_ms integer, max_ms integer,
               last_error text, last_error_at timestamptz)
LANGUAGE sql STABLE AS $$
SELECT destination_id, sum(succeeded), sum(http_error), sum(transport_error),
       ARRAY[
           sum(h[1]), sum(h[2]), sum(h[3]), sum(h[4]), sum(h[5]), sum(h[6]), sum(h[7]),
           sum(h[8]), sum(h[9]), sum(h[10]), sum(h[11]), sum(h[12]), sum(h[13]), sum(h[14]),
           sum(h[15]), sum(h[16]), sum(h[17]), sum(h[18]), sum(h[19]), sum(h[20]), sum(h[21]),
           sum(h[22]), sum(h[23]), sum(h[24]), sum(h[25]), sum(h[26]), sum(h[27]), sum(h[28]),
           sum(h[29]), sum(h[30]), sum(h[31]), sum(h[32]), sum(h[33]), sum(h[34]), sum(h[35]),
           sum(h[36]), sum(h[37]), sum(h[38]), sum(h[39]), sum(h[40]), sum(h[41]), sum(h[42]),
           sum(h[43]), sum(h[44]), sum(h[45]), sum(h[46]), sum(h[47]), sum(h[48]), sum(h[49]),
           sum(h[50]), sum(h[51]), sum(h[52]), sum(h[53]), sum(h[54]), sum(h[55]), sum(h[56]),
           sum(h[57]), sum(h[58]), sum(h[59]), sum(h[60]), sum(h[61]), sum(h[62]), sum(h[63]),
           sum(h[64]), sum(h[65]), sum(h[66]), sum(h[67]), sum(h[68]), sum(h[69]), sum(h[70]),
           sum(h[71]), sum(h[72]), sum(h[73]), sum(h[74]), sum(h[75]), sum(h[76])],
       min(min_ms), max(max_ms),
       (array_agg(last_error ORDER BY last_error_at DESC)
            FILTER (WHERE last_error_at IS NOT NULL))[1],
       max(last_error_at)
  FROM (SELECT *, durations AS h FROM delivery_minutes) m
 WHERE minute > now() - window_s * interval '1 second' - interval '1 minute'
 GROUP BY destination_id
$$;

-- requeue_finished: move finished deliveries (dead or delivered) back into the queue as
-- first attempts, due now; returns their ids. Both replays use it (replay_delivery.sql,
-- replay_dead.sql). Its DELETE and INSERT run after the calling statement's snapshot was
-- taken: the rows it inserts are not visible to the rest of that statement.
CREATE FUNCTION requeue_finished(ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql AS $$
WITH moved AS (
    DELETE FROM finished_deliveries WHERE id = ANY (ids) RETURNING *
)
INSERT INTO deliveries
       (id, event_id, destination_id, status, attempt, next_attempt_at, ordering_key,
        last_error, created_at)
SELECT id, event_id, destination_id, 'pending', 0, now(), ordering_key, last_error,
       created_at
  FROM moved
RETURNING id
$$;

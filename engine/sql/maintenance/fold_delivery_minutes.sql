-- fold_delivery_minutes: fold one bounded batch of the per-writer rows of finished minutes
-- of delivery_minutes into one row per (minute, destination) with writer 0.
--   $1 batch limit int
-- Returns the rows folded away and the folded rows written.
-- Each session that records results writes its own row per minute and destination
-- (schema/011 says why), so a window would otherwise read one row per worker; folded, a
-- day of one destination is 1,440 rows however many workers there are. Only minutes that
-- ended more than a minute ago: the current and the previous one are still being
-- written, and folding them would only have the writers insert their rows again. A late
-- result for an older minute (an attempt that started long before it was recorded)
-- writes a per-writer row again, folded next time. SKIP LOCKED: a row a worker is
-- updating right now is left for next time, so this never waits for a worker, and a
-- worker waits at most for this short statement. The rows come from
-- delivery_minutes_unfolded_idx, which holds only the rows still to fold.
WITH taken AS (
    SELECT minute, destination_id, writer
      FROM delivery_minutes
     WHERE writer <> 0 AND minute < date_trunc('minute', now()) - interval '1 minute'
     ORDER BY minute
     LIMIT $1::int
       FOR UPDATE SKIP LOCKED
), removed AS (
    DELETE FROM delivery_minutes m
     USING taken t
     WHERE (m.minute, m.destination_id, m.writer) = (t.minute, t.destination_id, t.writer)
 RETURNING m.*
), folded AS (
    INSERT INTO delivery_minutes AS m
           (minute, destination_id, writer, succeeded, http_error, transport_error,
            durations, min_ms, max_ms, last_error, last_error_at)
    SELECT minute, destination_id, 0, sum(succeeded), sum(http_error), sum(transport_error),
           duration_histogram_sum(durations), min(min_ms), max(max_ms),
           (array_agg(last_error ORDER BY last_error_at DESC)
                FILTER (WHERE last_error_at IS NOT NULL))[1],
           max(last_error_at)
      FROM removed
     GROUP BY minute, destination_id
     ORDER BY minute, destination_id
        ON CONFLICT (minute, destination_id, writer) DO UPDATE
       SET succeeded = m.succeeded + excluded.succeeded,
           http_error = m.http_error + excluded.http_error,
           transport_error = m.transport_error + excluded.transport_error,
           durations = duration_histogram_add(m.durations, excluded.durations),
           min_ms = least(m.min_ms, excluded.min_ms),
           max_ms = greatest(m.max_ms, excluded.max_ms),
           last_error = CASE WHEN m.last_error_at IS NULL
                               OR excluded.last_error_at >= m.last_error_at
                             THEN coalesce(excluded.last_error, m.last_error)
                             ELSE m.last_error END,
           last_error_at = greatest(m.last_error_at, excluded.last_error_at)
    RETURNING 1
)
SELECT (SELECT count(*) FROM removed) AS folded_away, (SELECT count(*) FROM folded) AS written

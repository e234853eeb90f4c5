-- partitions_droppable: the dated partitions of one history table wholly older than the
-- retention cutoff, oldest first (never a DEFAULT partition; today's ends after now(), so
-- never today's). An events partition is kept while a delivery, queued or finished, refers
-- to one of its events: its events' ids lie between its lowest and highest id, and a
-- range probe of deliveries_event_idx and of each finished_deliveries_event_idx finds any
-- delivery referring to an id in between (a little more than its own events: ids are drawn
-- before created_at is fixed, so neighbouring days' ranges may overlap; kept a run longer
-- then, never dropped too soon). Ask after the finished_deliveries partitions are dropped:
-- what they referred to is then free. No delivery can come to refer to such an event
-- afterwards: a delivery is created with its event (enqueue_events.sql), or moved between
-- the two tables with its row (record_results.sql, replay), and this statement's one
-- snapshot sees a moving row in one table or the other.
--   $1 cutoff timestamptz, $2 table text: events, finished_deliveries or delivery_attempts
SELECT h.partition
  FROM history_partitions() h
 WHERE h.parent = $2::text AND NOT h.is_default AND h.upper <= $1::timestamptz
   AND ($2::text <> 'events' OR NOT EXISTS (
        SELECT 1
          FROM (SELECT min(e.id) AS lo, max(e.id) AS hi
                  FROM events e
                 WHERE e.created_at >= coalesce(h.lower, '-infinity')
                   AND e.created_at < h.upper) r
         WHERE EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id BETWEEN r.lo AND r.hi)
            OR EXISTS (SELECT 1 FROM finished_deliveries f
                        WHERE f.event_id BETWEEN r.lo AND r.hi)))
 ORDER BY h.upper

-- payload_sweeps_read: where payload retention stands in each partition (schema/026's
-- payload_sweeps), and the partitions wholly older than its cutoff, oldest first.
--   $1 cutoff timestamptz (payload retention's)
SELECT h.parent, h.partition, h.lower, h.upper, coalesce(s.after_id, 0),
       coalesce(s.left_some, false)
  FROM history_partitions() h
  LEFT JOIN payload_sweeps s ON s.partition = h.partition
 WHERE h.parent IN ('events', 'delivery_attempts') AND NOT h.is_default
   AND h.upper <= $1::timestamptz
   AND NOT coalesce(s.complete, false)
 ORDER BY h.upper, h.parent

-- history_relayout: on a fresh, empty database at schema/026, daily partitions from $1 days
-- ago instead of the legacy partition (which holds everything before the cutover, two days
-- ahead): the layout of a database partitioned for longer than its retention, whose
-- partition job has days to drop. Every dated partition, all empty, is dropped (the
-- engine's own drop_history_partition), then ensure_history_partitions creates the days
-- from $1 days ago to 3 days ahead, as the partition job does; returns how many it made.
--   $1 days back int
SELECT ensure_history_partitions(now() + interval '3 days',
                                 now() - make_interval(days => $1::int))
  FROM (SELECT count(drop_history_partition(h.partition))
          FROM history_partitions() h
         WHERE NOT h.is_default) AS dropped

-- The console's per-minute rollup of attempts (issue 17): what GET /v1/overview and
-- GET /v1/destinations/{id}/stats read instead of the attempts themselves. Reading an hour
-- of delivery_attempts per refresh cost ~500 ms with 10 attempts a second (and a day of
-- them for stats?window=24h), growing with the delivery rate: an open console was a load
-- on the database proportional to the traffic. Read from here, a refresh costs one row
-- per (minute, destination) whatever the rate. docs/decisions/0012-console-minute-rollup.md
-- has the choices and the numbers.
--
-- Written by record_results.sql and return_claims.sql in the statement that inserts the
-- attempts, so it is exact and in the same transaction. `writer` is the writing session's
-- pg_backend_pid(): a session runs one transaction at a time, so two workers recording
-- results for the same destination in the same minute never wait on one row lock (a
-- shared row per (minute, destination) would serialise their result writes behind each
-- other's commits). The maintenance leader folds the rows of finished minutes into one
-- row with writer 0 (fold_delivery_minutes.sql), so a window reads about one row per
-- minute and destination; retention deletes rows older than the console's longest window
-- (retention_minutes.sql).
CREATE TABLE delivery_minutes (
    minute          timestamptz NOT NULL,  -- date_trunc('minute', attempt started_at)
    destination_id  bigint NOT NULL,
    writer          integer NOT NULL,      -- pg_backend_pid() of the writer; 0: folded
    succeeded       integer NOT NULL DEFAULT 0,  -- 2xx
    http_error      integer NOT NULL DEFAULT 0,  -- another status: the destination answered
    transport_error integer NOT NULL DEFAULT 0,  -- no answer (timeout, refused, lost)
    -- Attempt durations as a histogram: element i (1-based) counts the attempts of bucket
    -- i - 1 of duration_bucket_bounds() below; attempts without a duration (lost ones) are
    -- not in it.
    durations       integer[] NOT NULL,
    min_ms          integer,               -- the shortest and longest duration counted
    max_ms          integer,
    last_error      text,                  -- the latest error of the minute and when
    last_error_at   timestamptz,
    PRIMARY KEY (minute, destination_id, writer)
) WITH (fillfactor = 70);  -- room on the page for the current minute's updates to stay HOT

-- One destination's window (destination_stats.sql).
CREATE INDEX delivery_minutes_destination_idx ON delivery_minutes (destination_id, minute);
-- The rows still to fold: few (about a minute's per writer), found without reading the
-- folded day.
CREATE INDEX delivery_minutes_unfolded_idx ON delivery_minutes (minute) WHERE writer <> 0;

-- Duration buckets: bucket 0 holds 0 ms, bucket k (1..75) the durations from the k-th of
-- these lower bounds (ms) up to the next one, the last open-ended. They are 2^(j/4) rounded
-- up, j = 0..79, without repeats: four buckets per doubling, so a percentile read from the
-- histogram is within one bucket (at most 19 % above its lower bound) of the exact one.
-- engine/observe/duration_histogram.py holds the same list (a test compares them) and computes
-- percentiles from the counts.
CREATE FUNCTION duration_bucket_bounds() RETURNS integer[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '{1,2,3,4,5,6,7,8,10,12,14,16,20,23,27,32,39,46,54,64,77,91,108,128,153,182,216,256,305,363,431,512,609,725,862,1024,1218,1449,1723,2048,2436,2897,3445,4096,4871,5793,6889,8192,9742,11586,13778,16384,19484,23171,27555,32768,38968,46341,55109,65536,77936,92682,110218,131072,155872,185364,220436,262144,311744,370728,440872,524288,623488,741456,881744}'::integer[];

-- The histogram (76 counts) of an array of durations; NULLs are skipped.
CREATE FUNCTION duration_histogram(durations integer[]) RETURNS integer[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY(
    SELECT coalesce(c.n, 0)::integer
      FROM generate_series(0, 75) AS b(bucket)
      LEFT JOIN (SELECT width_bucket(d, duration_bucket_bounds()) AS bucket, count(*) AS n
                   FROM unnest(durations) AS d
                  WHERE d IS NOT NULL
                  GROUP BY 1) c USING (bucket)
     ORDER BY b.bucket);

-- Two histograms added element by element, and the aggregate summing a column of them.
CREATE FUNCTION duration_histogram_add(a integer[], b integer[]) RETURNS integer[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN ARRAY(SELECT x + y FROM unnest(a, b) WITH ORDINALITY AS u(x, y, i) ORDER BY i);

CREATE AGGREGATE duration_histogram_sum(integer[]) (
    SFUNC = duration_histogram_add, STYPE = integer[]
);

-- The last 25 hours of attempts recorded before this migration (the console reads at most
-- 24 h), read through delivery_attempts_started_idx (BRIN): bounded by that window, not by
-- the history. Attempts without a destination (before schema/007) are not counted.
INSERT INTO delivery_minutes
       (minute, destination_id, writer, succeeded, http_error, transport_error, durations,
        min_ms, max_ms, last_error, last_error_at)
SELECT date_trunc('minute', started_at), destination_id, 0,
       count(*) FILTER (WHERE status_code BETWEEN 200 AND 299),
       count(*) FILTER (WHERE status_code NOT BETWEEN 200 AND 299),
       count(*) FILTER (WHERE status_code IS NULL),
       duration_histogram(array_agg(duration_ms)), min(duration_ms), max(duration_ms),
       (array_agg(left(error, 500) ORDER BY started_at DESC)
            FILTER (WHERE error IS NOT NULL))[1],
       max(started_at) FILTER (WHERE error IS NOT NULL)
  FROM delivery_attempts
 WHERE started_at >= now() - interval '25 hours' AND destination_id IS NOT NULL
 GROUP BY 1, 2;

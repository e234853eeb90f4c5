-- The duration histogram functions of schema/011 again, with the same results at a tenth
-- of the cost on the result write (issue 12). record_results.sql builds one histogram per
-- (minute, destination) of each batch and adds it to that row's: with a batch spread over
-- many destinations (bench capped-slow: 18 destinations in a batch of 30 results) the
-- two functions were a third of the statement, 3.3 of 11.7 ms on a loaded 2-core VM.
-- Measured per call on PostgreSQL 15 (5,000 calls, 2026-12-02):
--   duration_histogram:     59 us as SQL (a 76-row generate_series joined to the counts,
--                           run by the SQL-function executor), 5.6 us as this PL/pgSQL
--                           loop over the few durations;
--   duration_histogram_add: 36 us as SQL over unnest() WITH ORDINALITY, 24 us as a
--                           PL/pgSQL loop, 7 us as this one expression, which the planner
--                           inlines into the calling statement.
-- tests/test_delivery_minutes.py compares both with engine/observe/duration_histogram.py.

CREATE OR REPLACE FUNCTION duration_histogram(durations integer[]) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    bounds constant integer[] := duration_bucket_bounds();
    counts integer[] := array_fill(0, ARRAY[76]);  -- element i counts bucket i - 1
    d integer;
    b integer;
BEGIN
    FOREACH d IN ARRAY coalesce(durations, '{}') LOOP
        IF d IS NOT NULL THEN
            b := width_bucket(d, bounds) + 1;
            counts[b] := counts[b] + 1;
        END IF;
    END LOOP;
    RETURN counts;
END $$;

-- Not STRICT any more: a strict SQL function whose body builds an array is not inlined.
-- The NULL cases say what STRICT did for the aggregate duration_histogram_sum (its first
-- histogram becomes the state; a NULL one is skipped). The histograms are 76 long
-- (duration_bucket_bounds() has 75 bounds), so the sum is written out element by element.
CREATE OR REPLACE FUNCTION duration_histogram_add(a integer[], b integer[]) RETURNS integer[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN a IS NULL THEN b WHEN b IS NULL THEN a ELSE ARRAY[
        a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4], a[5] + b[5], a[6] + b[6],
        a[7] + b[7], a[8] + b[8], a[9] + b[9], a[10] + b[10], a[11] + b[11], a[12] + b[12],
        a[13] + b[13], a[14] + b[14], a[15] + b[15], a[16] + b[16], a[17] + b[17], a[18] + b[18],
        a[19] + b[19], a[20] + b[20], a[21] + b[21], a[22] + b[22], a[23] + b[23], a[24] + b[24],
        a[25] + b[25], a[26] + b[26], a[27] + b[27], a[28] + b[28], a[29] + b[29], a[30] + b[30],
        a[31] + b[31], a[32] + b[32], a[33] + b[33], a[34] + b[34], a[35] + b[35], a[36] + b[36],
        a[37] + b[37], a[38] + b[38], a[39] + b[39], a[40] + b[40], a[41] + b[41], a[42] + b[42],
        a[43] + b[43], a[44] + b[44], a[45] + b[45], a[46] + b[46], a[47] + b[47], a[48] + b[48],
        a[49] + b[49], a[50] + b[50], a[51] + b[51], a[52] + b[52], a[53] + b[53], a[54] + b[54],
        a[55] + b[55], a[56] + b[56], a[57] + b[57], a[58] + b[58], a[59] + b[59], a[60] + b[60],
        a[61] + b[61], a[62] + b[62], a[63] + b[63], a[64] + b[64], a[65] + b[65], a[66] + b[66],
        a[67] + b[67], a[68] + b[68], a[69] + b[69], a[70] + b[70], a[71] + b[71], a[72] + b[72],
        a[73] + b[73], a[74] + b[74], a[75] + b[75], a[76] + b[76]] END;

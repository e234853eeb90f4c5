-- status_statements: the claim statement's share of all execution time recorded by
-- pg_stat_statements (run only when the extension is installed). The claim is recognised
-- by the comment that opens engine/sql/claim/claim_batch.sql.
SELECT coalesce(sum(total_exec_time) FILTER (WHERE query LIKE '-- claim_batch:%'), 0)
           AS claim_ms,
       coalesce(sum(total_exec_time), 0) AS total_ms,
       coalesce(sum(calls) FILTER (WHERE query LIKE '-- claim_batch:%'), 0) AS claim_calls
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())

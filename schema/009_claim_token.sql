-- A claim token: which claim of a delivery a result belongs to.
--
-- claim_batch.sql stamps every row it claims with a fresh value of claim_token_seq (one
-- per claim statement), and a result changes a delivery only if it carries the token the
-- row holds now (record_results.sql). Before, the guard was (locked_by, attempt), and a
-- claim that was released (attempt undone) and claimed again by the same worker had the
-- same pair: a late result of the first claim was applied to the second. The token is
-- cleared whenever a row leaves in_flight, so no result can match a pending row.
-- A sequence, not a per-row counter: a delivery replayed from finished_deliveries starts
-- a new row, and a counter would count from zero again.
CREATE SEQUENCE claim_token_seq AS bigint;
ALTER TABLE deliveries ADD COLUMN claim_token bigint;

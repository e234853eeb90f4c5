-- snapshot_read_only: the first statement of a transaction whose reads must agree with
-- each other (engine status, the console's overview): one snapshot for all of them, and
-- nothing written by mistake.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY

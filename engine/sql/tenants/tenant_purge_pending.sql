-- tenant_purge_pending: remove one bounded batch of a deleted tenant's pending deliveries;
-- the caller repeats it, each batch its own short transaction, until one comes back short.
-- In-flight ones finish as their worker records them. SKIP LOCKED: a row a claimer holds
-- now is left to it.
--   $1 tenant id bigint, $2 batch limit int
WITH batch AS (
    SELECT id FROM deliveries
     WHERE tenant_id = $1::bigint AND status = 'pending'
     LIMIT $2::int
       FOR UPDATE SKIP LOCKED
), removed AS (
    DELETE FROM deliveries d USING batch WHERE d.id = batch.id RETURNING d.id
)
SELECT count(*) FROM removed

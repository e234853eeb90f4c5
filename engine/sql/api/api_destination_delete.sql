-- api_destination_delete: DELETE /v1/destinations/{id}: marked deleted, its rows kept.
--   $1 destination id bigint, $2 tenant id bigint
UPDATE destinations SET deleted_at = now(), updated_at = now()
 WHERE id = $1::bigint AND tenant_id = $2::bigint AND deleted_at IS NULL
RETURNING id

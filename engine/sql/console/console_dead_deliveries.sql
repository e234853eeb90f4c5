-- console_dead_deliveries: GET /v1/deliveries?status=dead (with or without
-- destination_id), newest first, keyset paging: what an operator opens to see why a
-- destination fails before replaying it.
--   $1 destination id bigint (NULL: any), $2 before id bigint (NULL: first page),
--   $3 limit int, $4 tenant id bigint
-- Served by the partial indexes of dead rows only (schema/007), walked backwards from the
-- cursor: the general listing (store.py) filters status on finished_deliveries' whole
-- (destination_id, id) range instead, which reads every finished delivery of the
-- destination when few of them are dead (1.3 s with a million). Two branches so that each
-- is a plain range of its own index in a generic plan too.
(SELECT id, event_id, destination_id, status::text, attempt, next_attempt_at, last_error,
        created_at, completed_at
   FROM finished_deliveries
  WHERE status = 'dead' AND $1::bigint IS NULL AND tenant_id = $4::bigint
    AND id < coalesce($2::bigint, 9223372036854775807)
  ORDER BY id DESC LIMIT $3::int)
UNION ALL
(SELECT id, event_id, destination_id, status::text, attempt, next_attempt_at, last_error,
        created_at, completed_at
   FROM finished_deliveries
  WHERE status = 'dead' AND destination_id = $1::bigint AND tenant_id = $4::bigint
    AND id < coalesce($2::bigint, 9223372036854775807)
  ORDER BY id DESC LIMIT $3::int)

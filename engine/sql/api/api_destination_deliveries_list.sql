-- api_destination_deliveries_list: GET /v1/deliveries with a destination_id, a page of one
-- destination's deliveries (api_deliveries_list.sql with $6).
--   $1 status text (NULL: any), $2 before id bigint (NULL: first page), $3 limit int,
--   $4 scan deliveries bool, $5 scan finished_deliveries bool, $6 destination id bigint,
--   $7 tenant id bigint: the destination must be the tenant's, else the page is empty
-- Keyset pagination, newest first, over both tables (they share one id sequence). Each
-- side is limited on its own so it can walk an index backwards and stop early. $4/$5 say
-- which tables can hold the wanted status at all (pending/in_flight live only in
-- `deliveries`, delivered/dead only in `finished_deliveries`): a false one is a one-time
-- filter, so that side is not scanned at all.
-- By destination: (destination_id, id) on finished_deliveries; (destination_id, status)
-- on the hot table, whose rows per destination are that destination's backlog.
-- Returns the delivery columns engine/ingress/schemas.py `Delivery` takes, then completed_at
-- (NULL in the hot table); the same list in every api_*deliver*.sql.
(SELECT
       id, event_id, destination_id, status::text, attempt, next_attempt_at, last_error,
       created_at, NULL::timestamptz
   FROM deliveries
  WHERE ($1::text IS NULL OR status::text = $1::text)
    AND ($2::bigint IS NULL OR id < $2::bigint)
    AND destination_id = $6::bigint AND $4::bool AND tenant_id = $7::bigint
  ORDER BY id DESC LIMIT $3::int)
UNION ALL
(SELECT
       id, event_id, destination_id, status::text, attempt, next_attempt_at, last_error,
       created_at, completed_at
   FROM finished_deliveries
  WHERE ($1::text IS NULL OR status::text = $1::text)
    AND ($2::bigint IS NULL OR id < $2::bigint)
    AND destination_id = $6::bigint AND $5::bool AND tenant_id = $7::bigint
  ORDER BY id DESC LIMIT $3::int)
ORDER BY id DESC LIMIT $3::int

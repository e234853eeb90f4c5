-- fill_tenant_backlog: $1 pending deliveries, one event each, to the destinations of $2 in
-- turn (delivery n to element 1 + n % cardinality), each event and delivery of its
-- destination's tenant ($3, the same order as $2), due now (tenant_backlog_due.sql moves
-- them). Event ids are drawn first, as enqueue_events.sql does, so each delivery names
-- its event without relying on the order of RETURNING rows.
--   $1 deliveries int, $2 destination ids bigint[], $3 their tenant ids bigint[],
--   $4 payload text
WITH targets AS MATERIALIZED (
    SELECT nextval('events_id_seq'::regclass) AS event_id,
           ($2::bigint[])[1 + n % cardinality($2::bigint[])] AS destination_id,
           ($3::bigint[])[1 + n % cardinality($3::bigint[])] AS tenant_id
      FROM generate_series(0, $1::int - 1) AS n
), new_events AS (
    INSERT INTO events (id, type, payload, delivery_count, tenant_id)
    OVERRIDING SYSTEM VALUE
    SELECT event_id, 'order.created', $4::text, 1, tenant_id FROM targets
)
INSERT INTO deliveries (event_id, destination_id, tenant_id)
SELECT event_id, destination_id, tenant_id FROM targets

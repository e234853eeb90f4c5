-- enqueue_events: write a batch of events and all their deliveries in one statement.
--   $1 types text[], $2 payloads text[], $3 ordering_keys text[], $4 idempotency_keys text[],
--   $5 request_hashes bytea[], $6 explicit bool[] (true: targets listed in $7/$8, false:
--   fan out to every active destination subscribed to the type)
--   $7 target_ord int[] (1-based event position), $8 target_destination_id bigint[]
--   $9 tenant_ids bigint[]: each event's tenant. An event reaches only its own tenant's
--      destinations, by fan-out or listed (the committer refuses a listed destination of
--      another tenant before this runs; one deleted or moved since is skipped here).
--      Its deliveries carry the tenant, for the claim's fair share (claim_batch.sql).
--   $10 channels text[]: each event's channel names joined by commas (names cannot hold
--      one; NULL: none), $11 filterable bool[]: whether its payload may be parsed as
--      jsonb (false: no filter admits it; engine/ingress/committer.py sets it false for
--      a payload jsonb cannot hold after this statement failed to parse it)
--   $12 traceparents text[]: each event's W3C traceparent (NULL: none; ingress drops a
--      malformed one), the parent of its attempts' spans (docs/decisions/0035)
-- Routing (SPEC "Routing", docs/decisions/0033): a destination is a target only if its
-- `filter_path` (NULL: no filter) matches the payload and, when the event has channels,
-- it is subscribed to one of them. Both hold for listed destinations too ("an event
-- reaches a destination only if its payload matches"); event types filter fan-out only.
-- Returns one row per event position: its id and delivery count, or a NULL id when its
-- idempotency key already exists (the caller then reads the first answer).
-- Idempotency keys live in idempotency_keys (schema/025: events is partitioned by
-- created_at, and a unique index on it must hold created_at): `keyed` claims each key of
-- the batch there (ON CONFLICT DO NOTHING waits for a concurrent claim of the same key, as
-- the unique index on events did), and an event with a key is written only if its key was
-- claimed by it. An event without a key costs nothing more: `keyed` is empty.
-- Each delivery's created_at is its event's (both now(), one statement): the claim finds
-- the event by (id, created_at), which run-time pruning turns into one partition
-- (claim_batch.sql).
-- Ids are drawn up front so deliveries can refer to their event without relying on the
-- order of RETURNING rows. The sequence by name, as a constant: pg_get_serial_sequence()
-- here ran once per event, each a catalog lookup (a tenth of a 1000-event batch).
WITH incoming AS (
    SELECT nextval('events_id_seq'::regclass) AS id, e.type, e.payload, e.ordering_key,
           e.idempotency_key, e.request_hash, e.explicit, e.tenant_id,
           string_to_array(e.channels, ',') AS channels, e.filterable, e.traceparent, e.ord
      FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::bool[],
                  $9::bigint[], $10::text[], $11::bool[], $12::text[])
           WITH ORDINALITY AS e(type, payload, ordering_key, idempotency_key, request_hash,
                                explicit, tenant_id, channels, filterable, traceparent, ord)
), listed AS (
    SELECT DISTINCT t.ord, t.destination_id
      FROM unnest($7::int[], $8::bigint[]) AS t(ord, destination_id)
), fanned AS MATERIALIZED (
    -- The events that fan out, narrow: the join below may rescan them once per destination,
    -- and `incoming` holds the payloads (5,000 of 1 KB spill past a stock work_mem: a
    -- rescan per destination read 600,000 temporary blocks, 1.3 s of a batch).
    SELECT id, ord, type, ordering_key, tenant_id, channels FROM incoming WHERE NOT explicit
), documents AS MATERIALIZED (
    -- Payloads parsed once per event, and only for tenants with a filtered destination
    -- (destinations_filtered_tenant_idx): the others pay one index probe per event.
    SELECT i.ord, i.payload::jsonb AS document
      FROM incoming i
     WHERE i.filterable
       AND EXISTS (SELECT FROM destinations d
                    WHERE d.tenant_id = i.tenant_id AND d.filter_path IS NOT NULL
                      AND d.deleted_at IS NULL)
), target AS (
    -- Listed targets through `listed`, fan-out by each destination's event types: two
    -- joins, so an explicit event costs its listed destinations only. One join with a CASE
    -- of both tested every event against every destination (5,000 listed events x 1,000
    -- destinations: 6 s on PostgreSQL 15, most of a bench's start-up). Channels and the
    -- filter apply to both; a filter's "unknown" (jsonpath's third value, or no document)
    -- is false.
    SELECT i.id AS event_id, i.ord, dest.id AS destination_id,
           CASE WHEN dest.ordered THEN coalesce(i.ordering_key, '') END AS ordering_key,
           i.tenant_id
      FROM incoming i
      JOIN listed l ON l.ord = i.ord
      JOIN destinations dest ON dest.id = l.destination_id AND dest.deleted_at IS NULL
                            AND dest.tenant_id = i.tenant_id
      LEFT JOIN documents doc ON doc.ord = i.ord
     WHERE i.explicit
       AND (i.channels IS NULL OR dest.channels && i.channels)
       AND (dest.filter_path IS NULL
            OR coalesce(jsonb_path_match(doc.document, dest.filter_path), false))
    UNION ALL
    SELECT f.id, f.ord, dest.id,
           CASE WHEN dest.ordered THEN coalesce(f.ordering_key, '') END, f.tenant_id
      FROM fanned f
      JOIN destinations dest
        ON dest.tenant_id = f.tenant_id
       AND dest.deleted_at IS NULL AND NOT dest.disabled
       AND (dest.event_types IS NULL OR f.type = ANY (dest.event_types))
       AND (f.channels IS NULL OR dest.channels && f.channels)
      LEFT JOIN documents doc ON doc.ord = f.ord
     WHERE dest.filter_path IS NULL
        OR coalesce(jsonb_path_match(doc.document, dest.filter_path), false)
), counted AS (
    -- Counted once, grouped: a count subquery per event would rescan `target` for every
    -- event (quadratic: 150 ms of a 1000-event batch).
    SELECT event_id, count(*) AS deliveries FROM target GROUP BY event_id
), keyed AS (
    INSERT INTO idempotency_keys (tenant_id, idempotency_key, event_id, event_created_at,
                                  request_hash, delivery_count)
    SELECT i.tenant_id, i.idempotency_key, i.id, now(), i.request_hash,
           coalesce(c.deliveries, 0)
      FROM incoming i
      LEFT JOIN counted c ON c.event_id = i.id
     WHERE i.idempotency_key IS NOT NULL
     ORDER BY i.ord
        ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
 RETURNING event_id
), inserted AS (
    INSERT INTO events (id, type, payload, ordering_key, idempotency_key, request_hash,
                        delivery_count, tenant_id, channels, traceparent, created_at)
    SELECT i.id, i.type, i.payload, i.ordering_key, i.idempotency_key, i.request_hash,
           coalesce(c.deliveries, 0), i.tenant_id, i.channels, i.traceparent, now()
      FROM incoming i
      LEFT JOIN counted c ON c.event_id = i.id
     WHERE i.idempotency_key IS NULL OR i.id IN (SELECT event_id FROM keyed)
     ORDER BY i.ord
 RETURNING id, delivery_count
), fanned_out AS (
    INSERT INTO deliveries (event_id, destination_id, ordering_key, tenant_id, created_at)
    SELECT t.event_id, t.destination_id, t.ordering_key, t.tenant_id, now()
      FROM target t
      JOIN inserted ins ON ins.id = t.event_id
     ORDER BY t.event_id, t.destination_id
)
SELECT i.ord, ins.id, ins.delivery_count
  FROM incoming i
  LEFT JOIN inserted ins ON ins.id = i.id
 ORDER BY i.ord

-- Routing by content (issue 41, SPEC "Routing", docs/decisions/0033-routing-filters.md).
-- A destination's `filter` is kept as given (jsonb, for reading back) and as the jsonpath
-- it compiles to (engine/webhooks/routing.py), which enqueue_events.sql runs against each
-- event's payload inside the ingest transaction; both change in the same statement, so a
-- change holds for the next event accepted by any ingress process on any host.
-- `channels` on destinations and events: an event with channels reaches only destinations
-- subscribed to one of them (NULL: none).
--
-- New nullable columns without a default change the catalog only; the two tables are
-- locked together first, with a lock_timeout well under deadlock_timeout, as in
-- 016_tenants.sql (docs/decisions/0028). The index reads destinations, which holds one
-- row per endpoint: built in the transaction.
SET LOCAL lock_timeout = '200ms';
LOCK TABLE destinations, events IN ACCESS EXCLUSIVE MODE;

ALTER TABLE destinations
    ADD COLUMN filter jsonb,
    ADD COLUMN filter_path jsonpath,
    ADD COLUMN channels text[],
    ADD CONSTRAINT destinations_filter_compiled_check
        CHECK ((filter IS NULL) = (filter_path IS NULL));
ALTER TABLE events ADD COLUMN channels text[];

-- Whether a tenant has any filtered destination: enqueue_events.sql parses an event's
-- payload as jsonb only then.
CREATE INDEX destinations_filtered_tenant_idx ON destinations (tenant_id)
    WHERE filter_path IS NOT NULL AND deleted_at IS NULL;

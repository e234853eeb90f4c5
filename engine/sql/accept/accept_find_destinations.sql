-- accept_find_destinations: which of the destinations a batch of submitted events lists
-- exist (and are not deleted), with their tenant; an event naming any other, or one of
-- another tenant, is refused before anything is written (engine/ingress/committer.py). A
-- destination deleted between this check and the insert simply gets no delivery:
-- enqueue_events.sql skips deleted ones.
--   $1 destination ids bigint[]
SELECT id, tenant_id FROM destinations WHERE id = ANY($1) AND deleted_at IS NULL

-- engine: no transaction
-- The indexes of the claim's fair share among tenants (issue 39, docs/decisions/0026).
-- Built CONCURRENTLY, each in its own statement, like 017: the running engine keeps
-- enqueueing and claiming while they are built; a build cut short leaves an invalid
-- index, so each is dropped first.
--
-- deliveries_tenant_due_idx: each tenant's pending deliveries in due order. The claim's
--   walk over the tenants with pending work (claim_batch.sql, `tenant_walk`) takes one
--   descent per tenant: the first entry after the previous tenant is the next tenant's
--   earliest pending delivery, which says at once whether it has due work; a tenant's
--   fair share is then an ordered scan of its own range that stops at the share. None of
--   the existing indexes can do either: deliveries_claimable_idx orders everyone's rows by
--   time, deliveries_destination_idx finds a tenant's rows only destination by
--   destination. Partial like deliveries_claimable_idx: a delivery is written into it
--   when enqueued and when put back for a retry, not when claimed or finished.
-- tenants_disabled_idx: the live disabled tenants, whose destinations no claim takes
--   (tenants has a row per customer, 10,000 and more; almost none disabled).
DROP INDEX CONCURRENTLY IF EXISTS deliveries_tenant_due_idx;
CREATE INDEX CONCURRENTLY deliveries_tenant_due_idx ON deliveries (tenant_id, next_attempt_at)
    WHERE status = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS tenants_disabled_idx;
CREATE INDEX CONCURRENTLY tenants_disabled_idx ON tenants (id)
    WHERE disabled AND deleted_at IS NULL;

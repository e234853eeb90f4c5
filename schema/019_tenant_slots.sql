-- Tenant-wide max_in_flight and rate_limit, enforced by the claim (issue 39,
-- docs/decisions/0029-tenant-limits.md).
--
-- deliveries.holds_tenant_slot: this in-flight delivery took one of its tenant's slots
--   under the tenant's max_in_flight (claim_limited_tenants.sql), and its result, release
--   or reap gives it back (record_results.sql, return_claims.sql), as holds_slot does for
--   a destination's (schema/006). A constant default: no table rewrite, the lock is
--   held for an instant.
-- tenants_set_aside_idx: the live tenants with limits of their own, or disabled: those
--   whose deliveries claim_batch.sql leaves alone (tenants has a row per customer,
--   10,000 and more, almost none of them limited). Small enough to build in the
--   transaction.
ALTER TABLE deliveries ADD COLUMN holds_tenant_slot boolean NOT NULL DEFAULT false;
CREATE INDEX tenants_set_aside_idx ON tenants (id)
    WHERE (disabled OR max_in_flight IS NOT NULL OR rate_limit IS NOT NULL)
      AND deleted_at IS NULL;

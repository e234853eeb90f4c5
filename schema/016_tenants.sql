-- Tenants (issue 39, docs/decisions/0026): every destination, event and delivery belongs
-- to one tenant, the operator's customer. Data from before tenants belongs to `default`,
-- tenant 1, the first row this migration writes.
--
-- Moving existing data into `default` writes no row: ADD COLUMN with a constant default
-- is a change to the catalog only (PostgreSQL 11 and later keep the value for the rows
-- that existed, however many), so it holds its ACCESS EXCLUSIVE lock for milliseconds on
-- a table of any size. lock_timeout bounds the wait for that lock: behind a long
-- transaction the migration fails fast and is retried (engine/db/migrate.py) instead of
-- queueing every query of the running engine behind it. The indexes that would read the
-- big tables are built without blocking writes in 017_tenant_indexes.sql.
--
-- The four tables are locked first, in one statement, before any other work, and
-- lock_timeout is well under deadlock_timeout (1 s by default; docs/decisions/0028).
-- Holding one table while waiting for the next can close a cycle with a running engine
-- transaction that holds the next and reads the first (record_results.sql reads events,
-- then waits for destinations): the deadlock detector would break it only after
-- deadlock_timeout, with every engine session waiting meanwhile, and might cancel the
-- engine's statement. Under it, the migration gives up first, releases what it holds, and
-- is tried again; the engine sees a short wait, no error.
--
-- destinations and events keep the default 1: a write through an unscoped path with the
-- admin token means `default` (SPEC, "Tenants and API keys"). The queue tables drop it
-- once the existing rows have it: a delivery takes its tenant from its event, always
-- named, so a statement never files it under `default` by omission.
--
-- The engine from before tenants keeps running on this schema until its host is restarted
-- (README, "Upgrades and migrations": migrate, then restart hosts one at a time), and it
-- names no tenant_id: its enqueue inserts deliveries and its result writes insert finished
-- deliveries without one. With NOT NULL and no default every such insert would fail, and
-- the old engine would accept no event and finish no delivery (docs/decisions/0028). So a
-- row inserted without a tenant takes its destination's (delivery_tenant_from_destination):
-- a delivery's tenant is its destination's by construction (enqueue_events.sql fans out
-- within the tenant), the destination exists before the insert (the event may be written
-- by the same statement, enqueue_events.sql), and a delivery made by a new engine
-- for another tenant and finished by an old one is filed under its own tenant, where a
-- DEFAULT 1 would have filed it under `default`. The trigger fires only for such a row
-- (WHEN ... IS NULL): the new engine's inserts, which name the tenant, do not call it.
SET LOCAL lock_timeout = '200ms';
LOCK TABLE destinations, events, deliveries, finished_deliveries IN ACCESS EXCLUSIVE MODE;

CREATE TABLE tenants (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    uid text NOT NULL CHECK (uid ~ '^[A-Za-z0-9._:-]{1,64}$'),
    name text,
    metadata jsonb,
    disabled boolean NOT NULL DEFAULT false,
    -- Tenant-wide limits, kept like a destination's (schema/006, schema/012): a slot
    -- counter changed under the tenant's advisory lock, and the next send time.
    max_in_flight integer CHECK (max_in_flight > 0),
    in_flight integer NOT NULL DEFAULT 0,
    rate_limit double precision CHECK (rate_limit > 0),
    rate_next_send_at timestamptz,
    deleted_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- A uid names one live tenant; a deleted tenant's uid may be given again.
CREATE UNIQUE INDEX tenants_uid_idx ON tenants (uid) WHERE deleted_at IS NULL;
INSERT INTO tenants (uid, name) VALUES ('default', 'default');

-- API keys: only the SHA-256 of the key is kept (a key is 32 random bytes: a slow hash
-- adds nothing against guessing). Ingress processes hold the live keys in memory and
-- reload them when auth_generation moves (engine/ingress/keys.py).
CREATE TABLE api_keys (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id bigint NOT NULL REFERENCES tenants (id),
    name text NOT NULL,
    prefix text NOT NULL,
    key_hash bytea NOT NULL UNIQUE,
    scopes text[] NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at timestamptz
);
CREATE INDEX api_keys_tenant_idx ON api_keys (tenant_id, id);

-- One row, one number: raised by every change that can take a key's access away or give
-- it (a key created or revoked, a tenant deleted or disabled). Each ingress process reads
-- it a few times a second and reloads its keys when it moved.
CREATE TABLE auth_generation (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    generation bigint NOT NULL
);
INSERT INTO auth_generation (generation) VALUES (1);

ALTER TABLE destinations ADD COLUMN tenant_id bigint NOT NULL DEFAULT 1;
ALTER TABLE events ADD COLUMN tenant_id bigint NOT NULL DEFAULT 1;
ALTER TABLE deliveries ADD COLUMN tenant_id bigint NOT NULL DEFAULT 1;
ALTER TABLE deliveries ALTER COLUMN tenant_id DROP DEFAULT;
ALTER TABLE finished_deliveries ADD COLUMN tenant_id bigint NOT NULL DEFAULT 1;
ALTER TABLE finished_deliveries ALTER COLUMN tenant_id DROP DEFAULT;

CREATE FUNCTION delivery_tenant_from_destination() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    SELECT d.tenant_id INTO NEW.tenant_id FROM destinations d WHERE d.id = NEW.destination_id;
    RETURN NEW;
END
$$;
CREATE TRIGGER deliveries_tenant_unnamed BEFORE INSERT ON deliveries
    FOR EACH ROW WHEN (NEW.tenant_id IS NULL)
    EXECUTE FUNCTION delivery_tenant_from_destination();
CREATE TRIGGER finished_deliveries_tenant_unnamed BEFORE INSERT ON finished_deliveries
    FOR EACH ROW WHEN (NEW.tenant_id IS NULL)
    EXECUTE FUNCTION delivery_tenant_from_destination();

-- destinations is small (one row per endpoint): built here.
CREATE INDEX destinations_tenant_idx ON destinations (tenant_id, id) WHERE deleted_at IS NULL;

-- The views and the function of schema/014 and 015, with the tenant.
CREATE OR REPLACE VIEW delivery_rows AS
SELECT id, event_id, destination_id, status::text AS status, attempt, next_attempt_at,
       last_error, created_at, NULL::timestamptz AS completed_at, tenant_id
  FROM deliveries
 UNION ALL
SELECT id, event_id, destination_id, status::text, attempt, next_attempt_at, last_error,
       created_at, completed_at, tenant_id
  FROM finished_deliveries;

CREATE OR REPLACE VIEW claimable_deliveries AS
SELECT d.id, d.destination_id, d.attempt, d.next_attempt_at, d.tenant_id
  FROM deliveries d
 WHERE d.status = 'pending'
   AND (d.ordering_key IS NULL OR NOT EXISTS (
         SELECT 1 FROM deliveries e
          WHERE e.destination_id = d.destination_id
            AND e.ordering_key = d.ordering_key
            AND e.id < d.id));

CREATE OR REPLACE FUNCTION requeue_finished(ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql AS $$
WITH moved AS (
    DELETE FROM finished_deliveries WHERE id = ANY (ids) RETURNING *
)
INSERT INTO deliveries
       (id, event_id, destination_id, status, attempt, next_attempt_at, ordering_key,
        last_error, created_at, tenant_id)
SELECT id, event_id, destination_id, 'pending', 0, now(), ordering_key, last_error,
       created_at, tenant_id
  FROM moved
RETURNING id
$$;

-- Operational events (schema/008) stay within the tenant of the destination they are
-- about: its subscribers only, and the event and its deliveries are that tenant's.
CREATE OR REPLACE FUNCTION enqueue_operational_event(event_type text, about bigint,
                                                     payload text)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    new_event_id bigint;
BEGIN
    WITH owner AS (
        SELECT tenant_id FROM destinations WHERE id = about
    ), targets AS (
        SELECT sub.id, CASE WHEN sub.ordered THEN '' END AS ordering_key, sub.tenant_id
          FROM destinations sub
         WHERE sub.tenant_id = (SELECT tenant_id FROM owner)
           AND event_type = ANY (sub.event_types) AND sub.id <> about
           AND NOT sub.disabled AND sub.deleted_at IS NULL
    ), event AS (
        INSERT INTO events (type, payload, delivery_count, tenant_id)
        SELECT event_type, payload, count(*), (SELECT tenant_id FROM owner)
          FROM targets HAVING count(*) > 0
        RETURNING id, tenant_id
    ), fanned_out AS (
        INSERT INTO deliveries (event_id, destination_id, ordering_key, tenant_id)
        SELECT event.id, targets.id, targets.ordering_key, event.tenant_id
          FROM event, targets
         ORDER BY targets.id
    )
    SELECT id INTO new_event_id FROM event;
    RETURN new_event_id;
END
$$;

-- The core tables. `deliveries` is the queue: it holds only what can still be claimed or
-- is in flight. Finished deliveries (delivered or dead) move to `finished_deliveries` in
-- the same statement that records their last attempt, so the hot table and its indexes
-- stay the size of the backlog, not of history.

CREATE TYPE delivery_status AS ENUM ('pending', 'in_flight', 'delivered', 'dead');
CREATE TYPE breaker_state AS ENUM ('closed', 'open', 'half_open');

CREATE TABLE destinations (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    url                   text        NOT NULL,
    secret                text        NOT NULL,
    -- During rotation the previous secret keeps signing until previous_secret_until.
    previous_secret       text,
    previous_secret_until timestamptz,
    event_types           text[],     -- NULL: every event type
    max_in_flight         integer     CHECK (max_in_flight > 0),  -- NULL: no cap
    ordered               boolean     NOT NULL DEFAULT false,
    timeout_ms            integer     NOT NULL DEFAULT 10000 CHECK (timeout_ms > 0),
    disabled              boolean     NOT NULL DEFAULT false,
    disabled_reason       text,
    paused                boolean     NOT NULL DEFAULT false,  -- operator pause
    -- Circuit breaker: `open` waits until paused_until, then one probe runs as `half_open`.
    breaker               breaker_state NOT NULL DEFAULT 'closed',
    paused_until          timestamptz,
    consecutive_failures  integer     NOT NULL DEFAULT 0,
    breaker_pause_ms      integer     NOT NULL DEFAULT 0,
    deleted_at            timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    type            text        NOT NULL,
    -- The payload exactly as ingress received it: text, not jsonb, so the bytes we sign
    -- and send are the bytes we were given.
    payload         text        NOT NULL,
    ordering_key    text,
    idempotency_key text,
    request_hash    bytea,
    delivery_count  integer     NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
-- A unique constraint, not memory: a repeated key is caught across processes and restarts.
CREATE UNIQUE INDEX events_idempotency_key_idx ON events (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_created_at_idx ON events USING brin (created_at);

-- Ids are shared by `deliveries` and `finished_deliveries`: a delivery keeps its id as it
-- moves between them.
CREATE SEQUENCE delivery_id_seq AS bigint;

CREATE TABLE deliveries (
    id              bigint          PRIMARY KEY DEFAULT nextval('delivery_id_seq'),
    event_id        bigint          NOT NULL REFERENCES events (id),
    destination_id  bigint          NOT NULL REFERENCES destinations (id),
    status          delivery_status NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'in_flight')),
    attempt         smallint        NOT NULL DEFAULT 0,
    next_attempt_at timestamptz     NOT NULL DEFAULT now(),
    -- Set only for destinations with `ordered`: '' when the event had no key.
    ordering_key    text,
    locked_by       text,
    locked_until    timestamptz,
    last_error      text,
    created_at      timestamptz     NOT NULL DEFAULT now()
);
ALTER SEQUENCE delivery_id_seq OWNED BY deliveries.id;

-- The claim path. Partial, so it holds only claimable rows. The leading boolean splits
-- first attempts from retries so the claim can reserve capacity for first attempts
-- with two range scans of this one index instead of a second index.
CREATE INDEX deliveries_claimable_idx ON deliveries ((attempt = 0), next_attempt_at)
    WHERE status = 'pending';
-- The reaper and release path: only in-flight rows.
CREATE INDEX deliveries_in_flight_idx ON deliveries (locked_until)
    WHERE status = 'in_flight';
-- Strict ordering: "is an earlier delivery of this (destination, key) unfinished?"
CREATE INDEX deliveries_ordering_idx ON deliveries (destination_id, ordering_key, id)
    WHERE ordering_key IS NOT NULL;
-- Backlog per destination, listing, replay and max_in_flight counts.
CREATE INDEX deliveries_destination_idx ON deliveries (destination_id, status);

-- Every status change rewrites the row and all its index entries (no HOT update is
-- possible: `status` is in the index predicates), so dead tuples pile up at the rate of
-- deliveries. The table itself stays small, so a percentage-based trigger would wait for
-- far too little garbage on a big backlog and far too much on a small one: trigger on an
-- absolute count instead, and let vacuum run without cost-based sleeping.
ALTER TABLE deliveries SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);

CREATE TABLE finished_deliveries (
    id              bigint          PRIMARY KEY,
    event_id        bigint          NOT NULL REFERENCES events (id),
    destination_id  bigint          NOT NULL REFERENCES destinations (id),
    status          delivery_status NOT NULL CHECK (status IN ('delivered', 'dead')),
    attempt         smallint        NOT NULL,
    next_attempt_at timestamptz     NOT NULL,
    ordering_key    text,
    last_error      text,
    created_at      timestamptz     NOT NULL,
    completed_at    timestamptz     NOT NULL DEFAULT now()
);
CREATE INDEX finished_deliveries_destination_idx ON finished_deliveries (destination_id, id);
CREATE INDEX finished_deliveries_dead_idx ON finished_deliveries (destination_id, completed_at)
    WHERE status = 'dead';
CREATE INDEX finished_deliveries_completed_idx ON finished_deliveries USING brin (completed_at);
CREATE INDEX finished_deliveries_event_idx ON finished_deliveries (event_id);
CREATE INDEX deliveries_event_idx ON deliveries (event_id);

-- Append-only history, one row per HTTP attempt (and per lost attempt: an expired lease
-- or a worker that died). No foreign key to deliveries: a delivery moves between tables.
CREATE TABLE delivery_attempts (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id    bigint      NOT NULL,
    attempt        smallint    NOT NULL,
    started_at     timestamptz NOT NULL,
    duration_ms    integer,
    status_code    smallint,
    response_body  text,
    error          text
);
CREATE INDEX delivery_attempts_delivery_idx ON delivery_attempts (delivery_id, id);
CREATE INDEX delivery_attempts_started_idx ON delivery_attempts USING brin (started_at);

-- Destinations whose breaker is not closed: the claim looks here for probes to run.
CREATE INDEX destinations_breaker_idx ON destinations (paused_until)
    WHERE breaker <> 'closed';

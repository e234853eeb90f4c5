-- The event-type catalog (issue 40, docs/decisions/0030-event-type-catalog.md): one per
-- engine, not per tenant. A type may carry a JSON Schema its events' payloads must pass
-- (checked by ingress from memory, engine/ingress/catalog.py).
--
-- name: the primary key, compared byte by byte (COLLATE "C"), so the list's keyset
--   cursor (event_types_list.sql) walks the index in the order it pages.
-- schema, example: JSON documents as given (the handler checks the schema, its size and
--   the example against it before writing).
-- event_type_generation: one row, one number, moved by every change to the catalog in
--   the statement that makes it; each ingress process reads it every 250 ms and reloads
--   the catalog when it moved (the pattern of auth_generation, schema/016). A row of its
--   own: a change to the catalog does not reload every process's keys, nor a key change
--   the catalog's compiled validators.
CREATE TABLE event_types (
    name text COLLATE "C" PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9._-]{1,128}$'),
    description text,
    schema jsonb,
    example jsonb,
    deprecated boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE event_type_generation (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    generation bigint NOT NULL
);
INSERT INTO event_type_generation (generation) VALUES (1);

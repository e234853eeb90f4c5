-- event_type_create: POST /v1/event-types (engine/ingress/event_types_api.py), after the
-- handler checked the schema and the example. No row when the name exists: the handler
-- answers 409. Moves event_type_generation: every ingress process reloads the catalog.
--   $1 name text, $2 description text (NULL: none), $3 schema text (a JSON Schema, or
--   NULL), $4 example text (a JSON document, or NULL), $5 deprecated bool
-- Returns the event-type columns in the order event_types_api.py `_event_type` reads
-- them (the same list in every event_type*.sql).
WITH created AS (
    INSERT INTO event_types (name, description, schema, example, deprecated)
    VALUES ($1::text, $2::text, $3::text::jsonb, $4::text::jsonb, $5::bool)
        ON CONFLICT (name) DO NOTHING
    RETURNING name, description, schema, example, deprecated, created_at, updated_at
), moved AS (
    UPDATE event_type_generation SET generation = generation + 1
     WHERE EXISTS (SELECT 1 FROM created)
)
SELECT name, description, schema, example, deprecated, created_at, updated_at FROM created

-- event_type_update: PATCH /v1/event-types/{name}, after event_type_lock.sql in the same
-- transaction: the whole row as the handler merged and checked it. Moves
-- event_type_generation: every ingress process reloads the catalog.
--   $1 name text, $2 description text, $3 schema text (a JSON Schema, or NULL),
--   $4 example text (a JSON document, or NULL), $5 deprecated bool
-- Returns the event-type columns in the order event_types_api.py `_event_type` reads
-- them (the same list in every event_type*.sql).
WITH changed AS (
    UPDATE event_types SET
        description = $2::text, schema = $3::text::jsonb, example = $4::text::jsonb,
        deprecated = $5::bool, updated_at = now()
     WHERE name = $1::text
 RETURNING name, description, schema, example, deprecated, created_at, updated_at
), moved AS (
    UPDATE event_type_generation SET generation = generation + 1
     WHERE EXISTS (SELECT 1 FROM changed)
)
SELECT name, description, schema, example, deprecated, created_at, updated_at FROM changed

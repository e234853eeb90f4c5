-- event_type_delete: DELETE /v1/event-types/{name}. Events of the type stay as they are;
-- new ones are no longer checked against its schema (and are refused under
-- --strict-event-types). No row when there is no such type. Moves event_type_generation.
--   $1 name text
WITH deleted AS (
    DELETE FROM event_types WHERE name = $1::text RETURNING name
), moved AS (
    UPDATE event_type_generation SET generation = generation + 1
     WHERE EXISTS (SELECT 1 FROM deleted)
)
SELECT name FROM deleted

-- event_type_lock: PATCH /v1/event-types/{name}, first statement of its transaction: the
-- row as it is, locked until event_type_update.sql writes the merged, checked result, so
-- two changes at once cannot leave an example that fails the other's schema.
--   $1 name text
-- Returns the event-type columns in the order event_types_api.py `_event_type` reads
-- them (the same list in every event_type*.sql).
SELECT name, description, schema, example, deprecated, created_at, updated_at FROM event_types WHERE name = $1::text FOR UPDATE

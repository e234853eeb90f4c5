-- event_type_read: GET /v1/event-types/{name}, one row by primary key.
--   $1 name text
-- Returns the event-type columns in the order event_types_api.py `_event_type` reads
-- them (the same list in every event_type*.sql).
SELECT name, description, schema, example, deprecated, created_at, updated_at FROM event_types WHERE name = $1::text

-- event_types_list: GET /v1/event-types, by name (byte order), keyset paging.
--   $1 after name text (the cursor; NULL: first page), $2 limit int
-- Returns the event-type columns in the order event_types_api.py `_event_type` reads
-- them (the same list in every event_type*.sql).
SELECT name, description, schema, example, deprecated, created_at, updated_at
  FROM event_types
 WHERE $1::text IS NULL OR name > $1::text
 ORDER BY name
 LIMIT $2::int

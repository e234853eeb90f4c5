-- event_types_live: the whole catalog as ingress checks events against it, read by each
-- ingress process when event_type_generation moved (engine/ingress/catalog.py), and the
-- generation read in the same snapshot, so a change committed after this read moves it
-- again. A few hundred rows at most, each schema at most 64 KiB.
-- Returns name, schema as JSON text (NULL: none), generation.
SELECT name, schema::text, (SELECT generation FROM event_type_generation)
  FROM event_types

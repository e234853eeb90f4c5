-- event_type_generation_read: the number every change to the catalog moves; each ingress
-- process reads it a few times a second and reloads the catalog (event_types_live.sql)
-- when it changed (engine/ingress/catalog.py). One row by primary key.
SELECT generation FROM event_type_generation

-- migration_probe: one row of each table the tenant migration alters, by primary key: it
-- needs the same ACCESS SHARE lock the engine's statements take, so it waits exactly when
-- they would (behind ALTER TABLE's ACCESS EXCLUSIVE, or behind a statement queued for it).
--   $1 an event and delivery id bigint, $2 a destination id bigint
SELECT (SELECT 1 FROM events WHERE id = $1),
       (SELECT 1 FROM deliveries WHERE id = $1),
       (SELECT 1 FROM finished_deliveries WHERE id = $1),
       (SELECT 1 FROM destinations WHERE id = $2)

-- migration_check: after the tenant migration, the rows written before it ($1: the highest
-- event id, $2: the highest finished delivery id of the history) and what they read as
-- their tenant; and the rows of every table by tenant, NULL counted.
--   $1 last history event id bigint, $2 last history delivery id bigint
SELECT (SELECT count(*) FROM events WHERE id <= $1),
       (SELECT count(*) FROM events WHERE id <= $1 AND tenant_id = 1),
       (SELECT count(*) FROM finished_deliveries WHERE id <= $2),
       (SELECT count(*) FROM finished_deliveries WHERE id <= $2 AND tenant_id = 1),
       (SELECT count(*) FROM destinations WHERE tenant_id IS DISTINCT FROM 1),
       (SELECT count(*) FROM deliveries WHERE tenant_id IS DISTINCT FROM 1),
       (SELECT count(*) FROM finished_deliveries WHERE tenant_id IS DISTINCT FROM 1),
       (SELECT uid FROM tenants WHERE id = 1)

-- auth_generation_read: the number every change to keys or tenants' access moves; each
-- ingress process reads it a few times a second and reloads its keys (keys_live.sql) when
-- it changed (engine/ingress/keys.py). One row by primary key.
SELECT generation FROM auth_generation

-- keys_live: every key that may be used now, with its tenant, read by each ingress
-- process when auth_generation moved (engine/ingress/keys.py), and the generation read in
-- the same snapshot, so a change committed after this read moves it again.
-- Returns key id, hash, scopes, tenant id, tenant uid, tenant disabled, generation.
SELECT k.id, k.key_hash, k.scopes, t.id, t.uid, t.disabled,
       (SELECT generation FROM auth_generation)
  FROM api_keys k
  JOIN tenants t ON t.id = k.tenant_id
 WHERE k.revoked_at IS NULL AND t.deleted_at IS NULL

-- event_payload_lock: lock one of the tenant's events before its payload is removed
-- (DELETE /v1/events/{id}/payload); returns its created_at, nothing for an unknown id or
-- another tenant's. FOR UPDATE waits for a replay holding the event (replay_delivery.sql
-- locks it FOR SHARE): event_payload_delete.sql then runs with a snapshot taken after that
-- replay committed, and sees the delivery it queued.
--   $1 event id bigint, $2 tenant id bigint
SELECT created_at FROM events WHERE id = $1::bigint AND tenant_id = $2::bigint FOR UPDATE

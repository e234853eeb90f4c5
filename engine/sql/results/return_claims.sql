-- return_claims: put in-flight deliveries back to pending, as lost attempts.
--   $1 locked_by text (NULL: any holder), $2 only_expired bool, $3 reason text,
--   $4 max_attempts int, $5 batch limit int,
--   $6 advisory lock class int (as in record_results.sql: "changing this destination's
--      slot count or breaker")
--   $7 tenant advisory lock class int (as record_results.sql's $9)
-- Used for a worker process that died (release_claims: all of its claims, at once) and
-- for leases that ran out (reap_expired: any holder, typically a lost host).
-- The attempt may have reached the destination, so it counts and is recorded; a delivery
-- that has used its last attempt this way is dead rather than sent once more. The last
-- attempt is the destination's own (its retry_schedule's length + 1), else $4.
-- `locked_until < CASE ...` rather than `NOT $2 OR ...`: an OR on a parameter cannot be an
-- index condition, so a generic plan would read the whole queue instead of
-- deliveries_in_flight_idx (every in-flight row has a locked_until).
-- A returned claim that held a slot of its destination's max_in_flight gives it back,
-- under the destination's advisory lock, taken in id order after the delivery rows
-- (lock_capped_destinations.sql says why that order cannot deadlock).
-- One that held a slot of its tenant's max_in_flight gives that back too, under the
-- tenant's advisory lock, after the destinations' (record_results.sql,
-- `tenant_slots_freed`).
WITH lost AS (
    SELECT d.id, coalesce(array_length(dest.retry_schedule, 1) + 1, $4) AS max_attempts
      FROM deliveries d
      JOIN destinations dest ON dest.id = d.destination_id
     WHERE d.status = 'in_flight'
       AND ($1::text IS NULL OR d.locked_by = $1)
       AND d.locked_until < CASE WHEN $2 THEN now() ELSE 'infinity' END
     LIMIT $5
       FOR UPDATE OF d SKIP LOCKED
), requeued AS (
    UPDATE deliveries d
       SET status = 'pending', locked_by = NULL, locked_until = NULL, claim_token = NULL,
           next_attempt_at = now(), last_error = $3
      FROM lost
     WHERE d.id = lost.id AND d.attempt < lost.max_attempts
 RETURNING d.id, d.attempt, d.destination_id, d.holds_slot, d.tenant_id, d.holds_tenant_slot
), died AS (
    DELETE FROM deliveries d
     USING lost
     WHERE d.id = lost.id AND d.attempt >= lost.max_attempts
 RETURNING d.*
), archived AS (
    INSERT INTO finished_deliveries
           (id, event_id, destination_id, status, attempt, next_attempt_at,
            ordering_key, last_error, created_at, tenant_id)
    SELECT id, event_id, destination_id, 'dead', attempt, next_attempt_at,
           ordering_key, $3, created_at, tenant_id
      FROM died
), slots_freed AS MATERIALIZED (
    SELECT f.destination_id, f.n, pg_advisory_xact_lock($6, (f.destination_id % 2147483648)::int)
      FROM (SELECT destination_id, count(*) AS n
              FROM (SELECT destination_id FROM requeued WHERE holds_slot
                    UNION ALL
                    SELECT destination_id FROM died WHERE holds_slot) returned
             GROUP BY destination_id
             ORDER BY destination_id) f
), slots_returned AS (
    UPDATE destinations dest
       SET in_flight = dest.in_flight - s.n
      FROM slots_freed s
     WHERE dest.id = s.destination_id
), tenant_slots_freed AS MATERIALIZED (
    SELECT f.tenant_id, f.n, pg_advisory_xact_lock($7, (f.tenant_id % 2147483648)::int)
      FROM (SELECT tenant_id, count(*) AS n
              FROM (SELECT tenant_id FROM requeued WHERE holds_tenant_slot
                    UNION ALL
                    SELECT tenant_id FROM died WHERE holds_tenant_slot) returned
             WHERE (SELECT count(*) FROM slots_freed) >= 0
             GROUP BY tenant_id
             ORDER BY tenant_id) f
), tenant_slots_returned AS (
    UPDATE tenants t
       SET in_flight = t.in_flight - s.n
      FROM tenant_slots_freed s
     WHERE t.id = s.tenant_id
), history AS (
    INSERT INTO delivery_attempts (delivery_id, destination_id, attempt, started_at, error)
    SELECT id, destination_id, attempt, now(), $3 FROM requeued
    UNION ALL
    SELECT id, destination_id, attempt, now(), $3 FROM died
), minutes AS (
    -- Lost attempts count in the console's per-minute rollup (schema/011) as attempts
    -- without an answer, in this session's own row, as record_results.sql adds its own.
    INSERT INTO delivery_minutes AS m
           (minute, destination_id, writer, transport_error, durations, last_error,
            last_error_at)
    SELECT date_trunc('minute', now()), destination_id, pg_backend_pid(), count(*),
           duration_histogram('{}'), left($3, 500), now()
      FROM (SELECT destination_id FROM requeued
            UNION ALL
            SELECT destination_id FROM died) returned
     GROUP BY destination_id
     ORDER BY destination_id
        ON CONFLICT (minute, destination_id, writer) DO UPDATE
       SET transport_error = m.transport_error + excluded.transport_error,
           last_error = excluded.last_error,
           last_error_at = excluded.last_error_at
), operational AS (
    -- engine.delivery.dead for each, as record_results.sql does (not for deliveries of
    -- operational events); enqueue_operational_event() is in schema/008.
    SELECT enqueue_operational_event('engine.delivery.dead', d.destination_id,
               json_build_object(
                   'type', 'engine.delivery.dead', 'delivery_id', d.id,
                   'event_id', d.event_id, 'event_type', ev.type,
                   'destination_id', d.destination_id, 'attempts', d.attempt,
                   'time', now(), 'reason', $3)::text) AS event_id
      FROM died d
      JOIN events ev ON ev.id = d.event_id AND ev.created_at = d.created_at
     WHERE ev.type NOT LIKE 'engine.%'
)
SELECT (SELECT count(*) FROM requeued) AS requeued, (SELECT count(*) FROM died) AS died,
       (SELECT count(event_id) FROM operational) AS operational_events

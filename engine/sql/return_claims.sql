-- return_claims: put in-flight deliveries back to pending, as lost attempts.
--   $1 locked_by text (NULL: any holder), $2 only_expired bool, $3 reason text,
--   $4 max_attempts int, $5 batch limit int,
--   $6 advisory lock class int (as in record_results.sql: "changing this destination's
--      slot count or breaker")
-- Used for a worker process that died (release_claims: all of its claims, at once) and
-- for leases that ran out (reap_expired: any holder, typically a lost host).
-- The attempt may have reached the destination, so it counts and is recorded; a delivery
-- that has used its last attempt this way is dead rather than sent once more.
-- `locked_until < CASE ...` rather than `NOT $2 OR ...`: an OR on a parameter cannot be an
-- index condition, so a generic plan would read the whole queue instead of
-- deliveries_in_flight_idx (every in-flight row has a locked_until).
-- A returned claim that held a slot of its destination's max_in_flight gives it back,
-- under the destination's advisory lock, taken in id order after the delivery rows
-- (lock_capped_destinations.sql says why that order cannot deadlock).
WITH lost AS (
    SELECT id
      FROM deliveries
     WHERE status = 'in_flight'
       AND ($1::text IS NULL OR locked_by = $1)
       AND locked_until < CASE WHEN $2 THEN now() ELSE 'infinity' END
     LIMIT $5
       FOR UPDATE SKIP LOCKED
), requeued AS (
    UPDATE deliveries d
       SET status = 'pending', locked_by = NULL, locked_until = NULL,
           next_attempt_at = now(), last_error = $3
      FROM lost
     WHERE d.id = lost.id AND d.attempt < $4
 RETURNING d.id, d.attempt, d.destination_id, d.holds_slot
), died AS (
    DELETE FROM deliveries d
     USING lost
     WHERE d.id = lost.id AND d.attempt >= $4
 RETURNING d.*
), archived AS (
    INSERT INTO finished_deliveries
           (id, event_id, destination_id, status, attempt, next_attempt_at,
            ordering_key, last_error, created_at)
    SELECT id, event_id, destination_id, 'dead', attempt, next_attempt_at,
           ordering_key, $3, created_at
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
), history AS (
    INSERT INTO delivery_attempts (delivery_id, attempt, started_at, error)
    SELECT id, attempt, now(), $3 FROM requeued
    UNION ALL
    SELECT id, attempt, now(), $3 FROM died
)
SELECT (SELECT count(*) FROM requeued) AS requeued, (SELECT count(*) FROM died) AS died

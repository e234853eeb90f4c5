-- return_claims: put in-flight deliveries back to pending, as lost attempts.
--   $1 locked_by text (NULL: any holder), $2 only_expired bool, $3 reason text,
--   $4 max_attempts int, $5 batch limit int
-- Used for a worker process that died (release_claims: all of its claims, at once) and
-- for leases that ran out (reap_expired: any holder, typically a lost host).
-- The attempt may have reached the destination, so it counts and is recorded; a delivery
-- that has used its last attempt this way is dead rather than sent once more.
-- `locked_until < CASE ...` rather than `NOT $2 OR ...`: an OR on a parameter cannot be an
-- index condition, so a generic plan would read the whole queue instead of
-- deliveries_in_flight_idx (every in-flight row has a locked_until).
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
       SET status = 'pending', locked_by = NULL, locked_until = NULL, claim_token = NULL,
           next_attempt_at = now(), last_error = $3
      FROM lost
     WHERE d.id = lost.id AND d.attempt < $4
 RETURNING d.id, d.attempt
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
), history AS (
    INSERT INTO delivery_attempts (delivery_id, attempt, started_at, error)
    SELECT id, attempt, now(), $3 FROM requeued
    UNION ALL
    SELECT id, attempt, now(), $3 FROM died
)
SELECT (SELECT count(*) FROM requeued) AS requeued, (SELECT count(*) FROM died) AS died

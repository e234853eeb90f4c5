-- record_results: apply a batch of attempt outcomes in one statement.
--   $1 worker_id text
--   $2 results json: an array of objects with the keys id, attempt (the attempt number
--      the worker claimed), outcome ('delivered' | 'retry' | 'dead' | 'gone' (410: retry
--      later and disable the destination) | 'released' (never sent: back to pending,
--      attempt undone)), started_at, duration_ms, status_code, error, body and
--      next_attempt_at (retry and gone)
--   $3 breaker threshold int, $4 breaker base pause ms int, $5 breaker max pause ms int
--
-- One JSON document, not one array per column: psycopg builds each array element by
-- element in Python (6 us per result, a tenth of a worker's CPU per delivery), while the
-- document is encoded in C (msgspec) and parsed in C here.
--
-- The guard (locked_by = $1, same attempt) makes a late result for a delivery that was
-- reaped, released or re-claimed change nothing, including its history and its
-- destination's breaker. `locked_by` is set exactly while a row is in flight, so the guard
-- leaves `status` out on purpose: a status condition lets the planner use the partial
-- in-flight index, whose statistics (taken when little was in flight) predict one row,
-- and it then joins that index to the batch by nested loop, quadratic in the batch size.
-- Without it the batch drives primary key lookups.
WITH result AS (
    SELECT *
      FROM ROWS FROM (json_to_recordset($2::json)
                      AS (id bigint, attempt smallint, outcome text,
                          next_attempt_at timestamptz, started_at timestamptz,
                          duration_ms int, status_code smallint, error text, body text))
           WITH ORDINALITY
           AS r(id, attempt, outcome, next_attempt_at, started_at, duration_ms,
                status_code, error, body, ord)
), finished AS (
    DELETE FROM deliveries d
     USING result r
     WHERE d.id = r.id AND d.attempt = r.attempt
       AND d.locked_by = $1
       AND r.outcome IN ('delivered', 'dead')
 RETURNING d.*, r.outcome, r.error
), archived AS (
    INSERT INTO finished_deliveries
           (id, event_id, destination_id, status, attempt, next_attempt_at,
            ordering_key, last_error, created_at)
    SELECT id, event_id, destination_id, outcome::delivery_status, attempt,
           next_attempt_at, ordering_key,
           CASE WHEN outcome = 'dead' THEN left(error, 500) END, created_at
      FROM finished
), requeued AS (
    UPDATE deliveries d
       SET status = 'pending',
           attempt = CASE WHEN r.outcome = 'released' THEN d.attempt - 1 ELSE d.attempt END,
           next_attempt_at = CASE WHEN r.outcome = 'released' THEN now()
                                  ELSE r.next_attempt_at END,
           last_error = CASE WHEN r.outcome = 'released' THEN d.last_error
                             ELSE left(r.error, 500) END,
           locked_by = NULL,
           locked_until = NULL
      FROM result r
     WHERE d.id = r.id AND d.attempt = r.attempt
       AND d.locked_by = $1
       AND r.outcome IN ('retry', 'gone', 'released')
 RETURNING d.id, d.destination_id, r.outcome
), applied AS (
    SELECT id, destination_id, outcome FROM finished
    UNION ALL
    SELECT id, destination_id, outcome FROM requeued WHERE outcome <> 'released'
), history AS (
    INSERT INTO delivery_attempts
           (delivery_id, attempt, started_at, duration_ms, status_code, response_body, error)
    SELECT r.id, r.attempt, r.started_at, r.duration_ms, r.status_code, r.body, r.error
      FROM result r
      JOIN applied a ON a.id = r.id
), outcomes AS (
    -- Outcomes in the order the worker saw them: what matters for the breaker is whether
    -- anything succeeded and how many failures came after the last success. A window, not
    -- a correlated subquery: the cost stays linear in the batch size.
    SELECT a.destination_id, a.outcome, r.ord,
           max(r.ord) FILTER (WHERE a.outcome = 'delivered')
               OVER (PARTITION BY a.destination_id) AS last_ok
      FROM applied a
      JOIN result r ON r.id = a.id
), per_destination AS (
    SELECT destination_id,
           bool_or(outcome = 'delivered') AS any_ok,
           count(*) FILTER (WHERE outcome <> 'delivered' AND ord > coalesce(last_ok, 0))
               AS trailing_failures,
           bool_or(outcome = 'gone') AS any_gone
      FROM outcomes
     GROUP BY destination_id
), locked_destinations AS (
    -- Lock in id order so two workers updating the same destinations cannot deadlock.
    SELECT dest.id, dest.consecutive_failures, dest.breaker, dest.breaker_pause_ms,
           p.any_ok, p.trailing_failures, p.any_gone,
           CASE WHEN p.any_ok THEN p.trailing_failures
                ELSE dest.consecutive_failures + p.trailing_failures END AS new_failures
      FROM destinations dest
      JOIN per_destination p ON p.destination_id = dest.id
     WHERE p.any_gone
        OR p.trailing_failures > 0
        OR dest.consecutive_failures > 0
        OR dest.breaker <> 'closed'
     ORDER BY dest.id
       FOR NO KEY UPDATE OF dest
), breaker AS (
    UPDATE destinations dest
       SET consecutive_failures = l.new_failures,
           breaker = CASE
               WHEN l.any_ok AND l.trailing_failures = 0 THEN 'closed'
               WHEN l.breaker = 'half_open' OR l.new_failures >= $3 THEN 'open'
               ELSE l.breaker END::breaker_state,
           breaker_pause_ms = CASE
               WHEN l.any_ok AND l.trailing_failures = 0 THEN 0
               WHEN l.breaker = 'half_open' THEN least(greatest(l.breaker_pause_ms * 2, $4), $5)
               WHEN l.breaker = 'closed' AND l.new_failures >= $3 THEN $4
               ELSE l.breaker_pause_ms END,
           paused_until = CASE
               WHEN l.any_ok AND l.trailing_failures = 0 THEN NULL
               WHEN l.breaker = 'half_open'
                   THEN now() + make_interval(
                            secs => least(greatest(l.breaker_pause_ms * 2, $4), $5) / 1000.0)
               WHEN l.breaker = 'closed' AND l.new_failures >= $3
                   THEN now() + make_interval(secs => $4 / 1000.0)
               ELSE dest.paused_until END,
           breaker_opened_at = CASE
               WHEN l.any_ok AND l.trailing_failures = 0 THEN NULL
               WHEN l.breaker = 'closed' AND l.new_failures >= $3 THEN now()
               ELSE dest.breaker_opened_at END,
           disabled = dest.disabled OR l.any_gone,
           disabled_reason = CASE WHEN l.any_gone AND NOT dest.disabled
                                  THEN 'endpoint answered 410 Gone'
                                  ELSE dest.disabled_reason END,
           updated_at = now()
      FROM locked_destinations l
     WHERE dest.id = l.id
 RETURNING dest.id, dest.breaker
)
SELECT (SELECT count(*) FROM applied) + (SELECT count(*) FROM requeued
                                         WHERE outcome = 'released') AS applied,
       (SELECT count(*) FROM breaker WHERE breaker = 'open') AS breakers_opened

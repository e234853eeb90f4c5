-- record_results: apply a batch of attempt outcomes in one statement.
--   $1 worker_id text
--   $2 results json: an array of objects with the keys id, attempt (the attempt number
--      the worker claimed), outcome ('delivered' | 'retry' | 'dead' | 'gone' (410: retry
--      later and disable the destination) | 'released' (never sent: back to pending,
--      attempt undone)), started_at, duration_ms, status_code, error, body and
--      next_attempt_at (retry and gone), claim_token (from the claim; see below), and
--      for a success that handed its capped slot on, slot_to and slot_to_token (below)
--   $3 breaker threshold int, $4 breaker base pause ms int, $5 breaker max pause ms int
--   $6 advisory lock class int (the key space of "updating this destination's breaker")
--   $7 notification channel text: the one idle workers LISTEN on (engine.db.queries)
--   $8 refilled destination ids bigint[]: those whose freed slots this transaction claims again itself
--      (refill_slots.sql, the next statement): nobody is woken for them
--   $9 tenant advisory lock class int (the key space of "changing this tenant's slot count",
--      lock_limited_tenants.sql)
-- Returns the results applied, the breakers opened, the claimers woken, the
-- operational events enqueued and whether the commit waits for the disk (ordered_waits).
-- The attempts also go to the console's per-minute rollup (`minutes`, schema/011).
--
-- One JSON document, not one array per column: psycopg builds each array element by
-- element in Python (a tenth of a worker's CPU per delivery, decision 0001), while the
-- document is encoded in C (msgspec) and parsed in C here.
--
-- The guard (locked_by = $1, same attempt, same claim_token) makes a late result for a
-- delivery that was reaped, released or re-claimed change nothing, including its history
-- and its destination's breaker. The token is what tells two claims of one worker with
-- the same attempt number apart (released, then claimed again; schema/009). A result
-- without a token (claim_token null: made by hand, not from a claim) is held to the
-- older (locked_by, attempt) guard only; the worker's results always carry it. `locked_by` is set exactly while a row is in flight, so the guard
-- leaves `status` out on purpose: a status condition lets the planner use the partial
-- in-flight index, whose statistics (taken when little was in flight) predict one row,
-- and it then joins that index to the batch by nested loop, quadratic in the batch size.
-- Without it the batch drives primary key lookups.
WITH result AS (
    SELECT *
      FROM ROWS FROM (json_to_recordset($2::json)
                      AS (id bigint, attempt smallint, outcome text,
                          next_attempt_at timestamptz, started_at timestamptz,
                          duration_ms int, status_code smallint, error text, body text,
                          claim_token bigint, slot_to bigint, slot_to_token bigint))
           WITH ORDINALITY
           AS r(id, attempt, outcome, next_attempt_at, started_at, duration_ms,
                status_code, error, body, claim_token, slot_to, slot_to_token, ord)
), finished AS (
    DELETE FROM deliveries d
     USING result r
     WHERE d.id = r.id AND d.attempt = r.attempt
       AND d.locked_by = $1
       AND d.claim_token IS NOT DISTINCT FROM coalesce(r.claim_token, d.claim_token)
       AND r.outcome IN ('delivered', 'dead')
 RETURNING d.*, r.outcome, r.error
), handed AS (
    -- A success that handed its slot under max_in_flight straight on to a spare claim of
    -- the same destination (refill_slots.sql claims spares; engine/worker/dispatcher.py sends
    -- one the moment an answer frees a slot, docs/decisions/0017). The slot changes rows,
    -- the counter stays as it is: the spare now holds it, and its own result gives it
    -- back. Only from a row that held a slot, to a spare of the same worker's current
    -- claim that holds none, and not to one whose own result is in this batch (both
    -- are done: the source's slot is simply freed). Whatever is not handed on here is
    -- freed as usual (slots_freed), so a refused handover never leaks a slot.
    UPDATE deliveries t
       SET holds_slot = true
      FROM finished f
      JOIN result r ON r.id = f.id
     WHERE f.holds_slot AND f.outcome = 'delivered'
       AND t.id = r.slot_to AND t.claim_token = r.slot_to_token
       AND t.locked_by = $1 AND t.destination_id = f.destination_id
       AND NOT t.holds_slot
       AND t.id NOT IN (SELECT id FROM result)
 RETURNING t.destination_id
), archived AS (
    INSERT INTO finished_deliveries
           (id, event_id, destination_id, status, attempt, next_attempt_at,
            ordering_key, last_error, created_at, tenant_id)
    SELECT id, event_id, destination_id, outcome::delivery_status, attempt,
           next_attempt_at, ordering_key,
           CASE WHEN outcome = 'dead' THEN left(error, 500) END, created_at, tenant_id
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
           locked_until = NULL,
           claim_token = NULL
      FROM result r
     WHERE d.id = r.id AND d.attempt = r.attempt
       AND d.locked_by = $1
       AND d.claim_token IS NOT DISTINCT FROM coalesce(r.claim_token, d.claim_token)
       AND r.outcome IN ('retry', 'gone', 'released')
 RETURNING d.id, d.destination_id, r.outcome, d.holds_slot, d.event_id, d.tenant_id,
           d.holds_tenant_slot, d.created_at
), applied AS (
    -- created_at: the event's too, which finds it in one partition (claim_batch.sql).
    SELECT id, destination_id, outcome, event_id, created_at FROM finished
    UNION ALL
    SELECT id, destination_id, outcome, event_id, created_at FROM requeued
     WHERE outcome <> 'released'
), history AS (
    INSERT INTO delivery_attempts
           (delivery_id, destination_id, attempt, started_at, duration_ms, status_code,
            response_body, error)
    SELECT r.id, a.destination_id, r.attempt, r.started_at, r.duration_ms, r.status_code,
           r.body, r.error
      FROM result r
      JOIN applied a ON a.id = r.id
), minutes AS (
    -- The same attempts added to the console's per-minute rollup (schema/011): one upsert
    -- per (minute, destination) of the batch, into this session's own row (writer), which
    -- no other transaction writes meanwhile, so it waits for no other worker.
    INSERT INTO delivery_minutes AS m
           (minute, destination_id, writer, succeeded, http_error, transport_error,
            durations, min_ms, max_ms, last_error, last_error_at)
    SELECT date_trunc('minute', r.started_at), a.destination_id, pg_backend_pid(),
           count(*) FILTER (WHERE r.status_code BETWEEN 200 AND 299),
           count(*) FILTER (WHERE r.status_code NOT BETWEEN 200 AND 299),
           count(*) FILTER (WHERE r.status_code IS NULL),
           duration_histogram(array_agg(r.duration_ms)), min(r.duration_ms),
           max(r.duration_ms),
           (array_agg(left(r.error, 500) ORDER BY r.started_at DESC)
                FILTER (WHERE r.error IS NOT NULL))[1],
           max(r.started_at) FILTER (WHERE r.error IS NOT NULL)
      FROM result r
      JOIN applied a ON a.id = r.id
     GROUP BY 1, 2
     ORDER BY 1, 2
        ON CONFLICT (minute, destination_id, writer) DO UPDATE
       SET succeeded = m.succeeded + excluded.succeeded,
           http_error = m.http_error + excluded.http_error,
           transport_error = m.transport_error + excluded.transport_error,
           durations = duration_histogram_add(m.durations, excluded.durations),
           min_ms = least(m.min_ms, excluded.min_ms),
           max_ms = greatest(m.max_ms, excluded.max_ms),
           last_error = CASE WHEN m.last_error_at IS NULL
                               OR excluded.last_error_at >= m.last_error_at
                             THEN coalesce(excluded.last_error, m.last_error)
                             ELSE m.last_error END,
           last_error_at = greatest(m.last_error_at, excluded.last_error_at)
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
), slots_freed AS (
    -- Every applied result gives back the slot its claim took under the destination's
    -- max_in_flight (claim_batch.sql), 'released' included, unless it handed it on.
    SELECT destination_id, sum(n) AS n
      FROM (SELECT destination_id, 1 AS n FROM finished WHERE holds_slot
            UNION ALL
            SELECT destination_id, 1 FROM requeued WHERE holds_slot
            UNION ALL
            SELECT destination_id, -1 FROM handed) f
     GROUP BY destination_id
), serialized AS MATERIALIZED (
    -- The destinations whose breaker or slot counter this batch updates, each under a
    -- transaction-level advisory lock taken in id order, so that two workers recording results for one
    -- destination take turns, and never in an order that can deadlock. Not row locks
    -- (FOR NO KEY UPDATE here, then the UPDATE below): under READ COMMITTED the row lock
    -- follows the row's update chain, but the UPDATE reaches the row again through the
    -- older version its snapshot sees and takes that version's tuple lock, queued behind
    -- another worker that waits for us; that deadlocked. With the advisory lock held, no
    -- other worker holds the row, and the UPDATE reads its current version (the SET
    -- expressions below use dest.*, re-evaluated on it), however long the lock took.
    -- Healthy uncapped destinations with nothing but successes in the batch need no update
    -- and are not locked. The same lock guards the slot counter (lock_capped_destinations.sql
    -- says how the claim uses it); it is taken after every delivery row this statement
    -- changes, as the reaper does.
    SELECT c.*, pg_advisory_xact_lock($6, (c.destination_id % 2147483648)::int)
      FROM (SELECT destination_id,
                   coalesce(p.any_ok, false) AS any_ok,
                   coalesce(p.trailing_failures, 0) AS trailing_failures,
                   coalesce(p.any_gone, false) AS any_gone,
                   p.destination_id IS NOT NULL AND (
                       p.any_gone OR p.trailing_failures > 0
                       OR dest.consecutive_failures > 0 OR dest.breaker <> 'closed')
                       AS breaker_changes,
                   coalesce(f.n, 0) AS slots_freed
              FROM per_destination p
              FULL JOIN slots_freed f USING (destination_id)
              JOIN destinations dest ON dest.id = destination_id) c
     WHERE c.breaker_changes OR c.slots_freed > 0
     ORDER BY c.destination_id
), tenant_slots_freed AS MATERIALIZED (
    -- Every applied result of a claim that took a slot under its tenant's max_in_flight
    -- (claim_limited_tenants.sql, holds_tenant_slot) gives it back, 'released' included,
    -- under the tenant's advisory lock. Those locks come after the destinations'
    -- (`serialized`, which the condition reads first), in tenant id order: the claim takes
    -- them in the same order (lock_limited_tenants.sql), so no cycle can form.
    SELECT f.tenant_id, f.n, pg_advisory_xact_lock($9, (f.tenant_id % 2147483648)::int)
      FROM (SELECT tenant_id, count(*) AS n
              FROM (SELECT tenant_id FROM finished WHERE holds_tenant_slot
                    UNION ALL
                    SELECT tenant_id FROM requeued WHERE holds_tenant_slot) held
             WHERE (SELECT count(*) FROM serialized) >= 0
             GROUP BY tenant_id
             ORDER BY tenant_id) f
), tenant_slots_returned AS (
    UPDATE tenants t
       SET in_flight = t.in_flight - s.n
      FROM tenant_slots_freed s
     WHERE t.id = s.tenant_id
 RETURNING t.in_flight + s.n >= t.max_in_flight AS was_full
), breaker AS (
    -- The outcomes in order: a success closes the breaker and clears the count, so only
    -- the failures after the last success apply, to a closed breaker if there was one.
    -- Then a half-open breaker re-opens with a doubled pause, a closed one opens at the
    -- threshold, an open one stays as it is. A destination here only to give slots back
    -- keeps its breaker as it is (the UNION ALL branch).
    UPDATE destinations dest
       SET (consecutive_failures, breaker, breaker_pause_ms, paused_until,
            breaker_opened_at, breaker_closed_at, failing_since) = (
           SELECT t.failures,
                  CASE WHEN t.reopens OR t.opens THEN 'open'
                       WHEN s.any_ok THEN 'closed'
                       ELSE dest.breaker END::breaker_state,
                  CASE WHEN t.reopens THEN t.doubled_ms
                       WHEN t.opens THEN $4
                       WHEN s.any_ok THEN 0
                       ELSE dest.breaker_pause_ms END,
                  CASE WHEN t.reopens THEN now() + make_interval(secs => t.doubled_ms / 1000.0)
                       WHEN t.opens THEN now() + make_interval(secs => $4 / 1000.0)
                       WHEN s.any_ok THEN NULL
                       ELSE dest.paused_until END,
                  CASE WHEN t.opens THEN now()
                       WHEN s.any_ok THEN NULL
                       ELSE dest.breaker_opened_at END,
                  CASE WHEN s.any_ok AND NOT (t.reopens OR t.opens)
                            AND dest.breaker <> 'closed' THEN now()
                       ELSE dest.breaker_closed_at END,
                  -- The auto-disable clock: since the first failure after the last success.
                  CASE WHEN s.trailing_failures = 0 THEN
                            CASE WHEN s.any_ok THEN NULL ELSE dest.failing_since END
                       WHEN s.any_ok THEN now()
                       ELSE coalesce(dest.failing_since, now()) END
             FROM (SELECT f.failures,
                          NOT s.any_ok AND dest.breaker = 'half_open' AS reopens,
                          (s.any_ok OR dest.breaker = 'closed') AND f.failures >= $3 AS opens,
                          least(greatest(dest.breaker_pause_ms * 2, $4), $5) AS doubled_ms
                     FROM (SELECT CASE WHEN s.any_ok THEN 0
                                       ELSE dest.consecutive_failures END
                                  + s.trailing_failures AS failures) f) t
            WHERE s.breaker_changes
           UNION ALL
           SELECT dest.consecutive_failures, dest.breaker, dest.breaker_pause_ms,
                  dest.paused_until, dest.breaker_opened_at, dest.breaker_closed_at,
                  dest.failing_since
            WHERE NOT s.breaker_changes),
           disabled = dest.disabled OR s.any_gone,
           disabled_reason = CASE WHEN s.any_gone AND NOT dest.disabled
                                  THEN 'endpoint answered 410 Gone'
                                  ELSE dest.disabled_reason END,
           disabled_at = CASE WHEN s.any_gone AND NOT dest.disabled THEN now()
                              ELSE dest.disabled_at END,
           updated_at = CASE WHEN s.breaker_changes THEN now() ELSE dest.updated_at END,
           in_flight = dest.in_flight - s.slots_freed
      FROM serialized s
     WHERE dest.id = s.destination_id
 -- Which changes this statement made: the columns it set to its own transaction's now()
 -- (RETURNING sees only the new row on PostgreSQL before 18, and `serialized` may have
 -- read an older one). Another transaction would have to have begun in the same
 -- microsecond to be mistaken for this one.
 RETURNING dest.id, dest.breaker, dest.url, dest.consecutive_failures, dest.disabled_reason,
           dest.breaker = 'open' AND dest.breaker_opened_at = now() AS opened,
           dest.breaker_closed_at = now() AS recovered,
           dest.disabled_at = now() AS disabled_now, s.breaker_changes,
           dest.in_flight + s.slots_freed >= dest.max_in_flight AS was_full
), application AS (
    -- The destinations with a delivery of an application event in this batch. A breaker
    -- that opened or recovered on deliveries of operational events alone announces
    -- nothing: two failing subscribers would otherwise tell each other about their
    -- breakers for ever (A opens, B fails to take the news and opens, A fails to take
    -- that and re-opens, ...; found by tests/test_operational_properties.py). Built only
    -- when a breaker opened or recovered (a hashed subplan of the branches below).
    SELECT DISTINCT a.destination_id
      FROM applied a
      JOIN events ev ON ev.id = a.event_id AND ev.created_at = a.created_at
     WHERE ev.type NOT LIKE 'engine.%'
), operational AS (
    -- The operational events this batch causes (engine/observe/operational_events.py), enqueued
    -- by this statement (enqueue_operational_event(), schema/008), so in the transaction
    -- of the change itself. A dead delivery of
    -- an operational event causes none: a failing subscriber cannot feed itself.
    SELECT 'engine.destination.breaker_opened' AS type, b.id AS about,
           json_build_object(
               'type', 'engine.destination.breaker_opened', 'destination_id', b.id,
               'url', b.url, 'time', now(),
               'reason', format('%s consecutive failed attempts', b.consecutive_failures)
           )::text AS payload
      FROM breaker b WHERE b.opened AND b.id IN (SELECT destination_id FROM application)
    UNION ALL
    SELECT 'engine.destination.recovered', b.id,
           json_build_object(
               'type', 'engine.destination.recovered', 'destination_id', b.id,
               'url', b.url, 'time', now(),
               'reason', 'a delivery succeeded after the breaker had opened')::text
      FROM breaker b WHERE b.recovered AND b.id IN (SELECT destination_id FROM application)
    UNION ALL
    SELECT 'engine.destination.disabled', b.id,
           json_build_object(
               'type', 'engine.destination.disabled', 'destination_id', b.id,
               'url', b.url, 'time', now(), 'reason', b.disabled_reason)::text
      FROM breaker b WHERE b.disabled_now
    UNION ALL
    SELECT 'engine.delivery.dead', f.destination_id,
           json_build_object(
               'type', 'engine.delivery.dead', 'delivery_id', f.id, 'event_id', f.event_id,
               'event_type', ev.type, 'destination_id', f.destination_id,
               'attempts', f.attempt, 'time', now(), 'reason', left(f.error, 500))::text
      FROM finished f
      JOIN events ev ON ev.id = f.event_id AND ev.created_at = f.created_at
     WHERE f.outcome = 'dead' AND ev.type NOT LIKE 'engine.%'
), operational_enqueued AS (
    -- Not a data-modifying CTE: it runs because the final SELECT reads it.
    SELECT enqueue_operational_event(o.type, o.about, o.payload) AS event_id
      FROM operational o
), ordered_waits AS (
    -- A worker's session commits without waiting for the disk (synchronous_commit off,
    -- engine/db/database.worker_dsn): a result lost in a server crash is sent again. Not
    -- so a batch that finishes a delivery with an ordering key: the next of its key may
    -- be sent once this commits, and the lost one sent again after it would arrive out of
    -- order. Its commit waits (a setting local to this transaction, read at its commit;
    -- runs because the final SELECT reads it).
    SELECT set_config('synchronous_commit', 'on', true)
      FROM finished WHERE ordering_key IS NOT NULL
     LIMIT 1
)
SELECT (SELECT count(*) FROM applied) + (SELECT count(*) FROM requeued
                                         WHERE outcome = 'released') AS applied,
       (SELECT count(*) FROM breaker WHERE breaker = 'open' AND breaker_changes)
           AS breakers_opened,
       -- A destination whose cap was full has had claims turned away: the workers that
       -- came back short wait for a notification (or their poll), so tell them its slots
       -- are free again, as ingress does for new deliveries. Without it a binding cap
       -- was refilled once per poll interval. (Notifications of one transaction with the
       -- same payload are delivered once.) Not for those the caller refills ($8): their
       -- slots are taken again before this transaction commits.
       -- A full tenant's likewise (claim_limited_tenants.sql; refill_slots.sql leaves
       -- those alone).
       (SELECT count(*) FROM (SELECT pg_notify($7, '') FROM breaker
                               WHERE was_full AND id <> ALL ($8::bigint[])
                              UNION ALL
                              SELECT pg_notify($7, '') FROM tenant_slots_returned
                               WHERE was_full) n)
           AS claimers_woken,
       (SELECT count(event_id) FROM operational_enqueued) AS operational_events,
       (SELECT count(*) FROM ordered_waits) > 0 AS waits_for_disk

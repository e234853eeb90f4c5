-- auto_disable: disable the destinations whose every attempt has failed for
-- `disable_after` (maintenance leader, every minute or so), each with an
-- engine.destination.disabled operational event in the same statement.
--   $1 disable_after seconds float8
-- failing_since is kept by record_results.sql: the first failure after the last success,
-- cleared by a success and by re-enabling (PATCH disabled: false). Their deliveries are
-- kept, as for any disabled destination. A result recorded meanwhile waits for the row
-- lock, and a success that cleared failing_since first makes the re-checked WHERE false.
-- A sequential read of destinations: it is small, and an index on failing_since would be
-- one more to maintain on every breaker update.
WITH disabled AS (
    UPDATE destinations dest
       SET disabled = true,
           disabled_at = now(),
           disabled_reason = 'every attempt has failed since '
               || to_char(dest.failing_since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
           updated_at = now()
     WHERE dest.failing_since < now() - make_interval(secs => $1)
       AND NOT dest.disabled AND dest.deleted_at IS NULL
 RETURNING dest.id, dest.url, dest.disabled_reason
), operational AS (
    SELECT enqueue_operational_event('engine.destination.disabled', d.id,
               json_build_object(
                   'type', 'engine.destination.disabled', 'destination_id', d.id,
                   'url', d.url, 'time', now(), 'reason', d.disabled_reason)::text)
               AS event_id
      FROM disabled d
)
SELECT (SELECT count(*) FROM disabled) AS disabled,
       (SELECT count(event_id) FROM operational) AS operational_events

-- lock_capped_destinations: the first statement of a claim transaction. Returns the ids of
-- destinations with a max_in_flight cap, due work and room below the cap, that this
-- transaction now holds a transaction-level advisory lock on.
--   $1 advisory lock class int (the key space of "claiming for a capped destination")
--
-- Why a lock at all: the claim counts a capped destination's in-flight deliveries from its
-- snapshot, so two claimers at once would each miss the other's uncommitted claims and
-- together exceed the cap. Holding this lock, a claimer is the only one claiming for that
-- destination, and since it is taken in an earlier statement than the claim, the claim's
-- snapshot already sees every claim committed by the previous holder (a transaction
-- becomes visible before it releases its locks).
-- Why try-lock: a destination another claimer is busy with is skipped this round, like a
-- SKIP LOCKED row, so capped destinations never serialise claims of anything else.
-- Uncapped destinations cost nothing here: destinations_capped_idx holds only capped rows.
-- MATERIALIZED keeps the lock function from being evaluated before the cheaper filters
-- (the planner orders plain quals by cost, and would try-lock destinations without work).
WITH candidates AS MATERIALIZED (
    SELECT dest.id
      FROM destinations dest
     WHERE dest.max_in_flight IS NOT NULL
       AND NOT dest.disabled AND NOT dest.paused AND dest.deleted_at IS NULL
       AND dest.breaker = 'closed'
       AND EXISTS (SELECT 1 FROM deliveries d
                    WHERE d.destination_id = dest.id AND d.status = 'pending'
                      AND d.next_attempt_at <= now())
       AND (SELECT count(*) FROM deliveries d
             WHERE d.destination_id = dest.id AND d.status = 'in_flight') < dest.max_in_flight
     ORDER BY random()
     LIMIT 32
)
SELECT id
  FROM candidates
 WHERE pg_try_advisory_xact_lock($1, (id % 2147483648)::int)

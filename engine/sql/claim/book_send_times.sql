-- book_send_times: move the next send times of the rate-limited tenants and destinations
-- that claim_limited_tenants.sql, the statement before, claimed for, past the send times
-- engine/db/send_schedule.py gave their claims; in the same transaction, before
-- claim_batch.sql.
--   $1 tenant ids bigint[], $2 tenant next send times timestamptz[]
--   $3 destination ids bigint[], $4 destination next send times timestamptz[]
-- Exact across processes and hosts as the claim is: the tenants' advisory locks
-- (lock_limited_tenants.sql) and the destinations' row locks (claim_limited_tenants.sql,
-- `rate_booked`) are held from before their next send times were read until we commit,
-- so nobody books from them in between.
WITH tenants_booked AS (
    UPDATE tenants t
       SET rate_next_send_at = b.next_send_at
      FROM unnest($1::bigint[], $2::timestamptz[]) AS b(id, next_send_at)
     WHERE t.id = b.id
)
UPDATE destinations dest
   SET rate_next_send_at = b.next_send_at
  FROM unnest($3::bigint[], $4::timestamptz[]) AS b(id, next_send_at)
 WHERE dest.id = b.id

-- Per-destination delivery features (issue 18): custom headers, a retry schedule, a rate
-- limit, and the clocks behind operational events and auto-disable.
ALTER TABLE destinations
    -- Static extra request headers {name: value}, validated by engine/destination_options.py.
    ADD COLUMN headers           jsonb,
    -- Retry delays in seconds replacing the engine's --retry-schedule; NULL: the global one.
    ADD COLUMN retry_schedule    double precision[],
    -- Requests per second across every process and host; NULL: no limit. The token bucket
    -- (rate_tokens as of rate_refilled_at, at most rate_limit of them: one second's worth)
    -- is refilled and spent by engine/sql/take_rate_tokens.sql.
    ADD COLUMN rate_limit        double precision CHECK (rate_limit > 0),
    ADD COLUMN rate_tokens       double precision,
    ADD COLUMN rate_refilled_at  timestamptz,
    -- The first failed attempt since the last success (NULL: the last attempt succeeded):
    -- the auto-disable clock. Re-enabling clears it.
    ADD COLUMN failing_since     timestamptz,
    -- When the destination was last disabled, and when its breaker last closed after being
    -- open. record_results.sql emits an operational event for a change it made itself,
    -- which it tells by these being its own transaction's now().
    ADD COLUMN disabled_at       timestamptz,
    ADD COLUMN breaker_closed_at timestamptz;

-- Rate-limited destinations are looked up on every claim; this index holds only them, so
-- a deployment without limits pays nothing for the lookup (as destinations_capped_idx).
-- Keyed on id, not on a column the claim writes, so those writes can stay HOT updates.
-- No index for the subscribers of operational events or for auto-disable: both read the
-- (small) destinations table rarely, and every index on it slows breaker updates.
CREATE INDEX destinations_rate_limited_idx ON destinations (id) WHERE rate_limit IS NOT NULL;

-- When the breaker last left `closed`: kept through open/half-open cycles, cleared when it
-- closes, so `engine status` can tell a destination that has been down for hours.
ALTER TABLE destinations ADD COLUMN breaker_opened_at timestamptz;

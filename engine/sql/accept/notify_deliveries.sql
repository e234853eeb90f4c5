-- notify_deliveries: wake the idle delivery workers (they LISTEN on the channel).
--   $1 notification channel text (engine.db.queries NOTIFY_CHANNEL)
SELECT pg_notify($1, '')

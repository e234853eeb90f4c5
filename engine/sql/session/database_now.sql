-- database_now: the database's clock, for bounds several statements must share (a replay
-- of dead deliveries replays only what died before it began).
SELECT now()

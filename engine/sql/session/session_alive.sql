-- session_alive: the cheapest round trip that proves a session works: the leader's
-- heartbeat (its session holds the leader lock), /healthz, and ingress's probe of a
-- database it lost.
SELECT 1

"""What tests and bench share: the embedded database server and per-test databases
(dbserver), the engine run as a real process (enginerun), the fake destination (fakedest,
a wrapper around bench/fakedest.mjs), ingress as a process (ingress_server), hostile and
scripted HTTP servers, database fault load, and the rows tests write and read (data)."""

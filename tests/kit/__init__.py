"""Test-only helpers: the embedded database server and per-test databases (dbserver), the
engine run as a real process (enginerun), hostile and scripted HTTP servers, database
fault load, and the rows tests write and read (data). What bench/ uses too (the fake
destination, ingress as a process) is in engine/testing/."""

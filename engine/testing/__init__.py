"""What the test suite and bench/ both use, importable wherever engine is installed (the
bench scripts run as plain scripts, so they cannot reach tests/): the fake destination
(fakedest, a handle on bench/fakedest.mjs) and the ingress server run as a process
(ingress_server). Test-only helpers live in tests/kit/."""

"""What the test suite and bench/ both use, importable wherever engine is installed (bench/
cannot import tests/): the fake destination (fakedest.py, a handle on fakedest.mjs beside
it), the ingress server run as a process (ingress_server.py) and a throwaway embedded
PostgreSQL (pgserver.py). Test-only helpers live in tests/kit/."""

#!/usr/bin/env bash
# The reliability (fault) suite of issue 13, RUNS times in a row (default 3), stopping at
# the first failing run: hostile destinations and their soak, frozen and cut-off hosts,
# database faults, the claim token, bad input (fuzz) and security. Each run prints the
# tests' FAULT / report lines (-s), so the closing numbers come from the same runs.
# Usage: tools/fault-suite.sh [RUNS] [pytest arguments...]
# ENGINE_SOAK_S=600 makes the hostile soak the 10-minute one (60 s by default).
set -u
runs=${1:-3}
shift || true
cd "$(dirname "$0")/.."
tests=(
    tests/test_hostile_destinations.py tests/test_hostile_soak.py tests/test_http_client.py
    tests/test_frozen_worker.py tests/test_netns_hosts.py tests/test_db_faults.py
    tests/test_liveness.py tests/test_claim_token.py tests/test_ingress_fuzz.py
    tests/test_ingress_idempotency.py tests/test_security.py
)
for run in $(seq "$runs"); do
    echo "== fault suite run $run of $runs, $(date +%T)"
    if ! PYTHONPATH=$PWD python -m pytest -q -s -p no:cacheprovider "${tests[@]}" "$@"; then
        echo "== run $run failed, $(date +%T)"
        exit 1
    fi
done
echo "== $runs runs in a row passed, $(date +%T)"

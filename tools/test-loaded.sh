#!/usr/bin/env bash
# The test suite with both cores of a 2-core machine kept busy by two spinning processes:
# no test may depend on wall-clock timing that a loaded machine breaks (issue 19).
# Usage: tools/test-loaded.sh [RUNS] [pytest arguments...]   (RUNS defaults to 3)
set -u
runs=${1:-3}
shift || true
cd "$(dirname "$0")/.."
python -c 'while 1: pass' &
spin1=$!
python -c 'while 1: pass' &
spin2=$!
trap 'kill "$spin1" "$spin2" 2>/dev/null' EXIT
failed=0
for run in $(seq "$runs"); do
    echo "== run $run of $runs, $(date +%T)"
    PYTHONPATH=$PWD python -m pytest -q "$@" || failed=$((failed + 1))
done
echo "== $failed of $runs runs failed, $(date +%T)"
[ "$failed" -eq 0 ]

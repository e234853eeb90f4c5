#!/usr/bin/env bash
# bench/run.sh [scenario] [--quick] [--procs N] [--dsn DSN] [--stock-pg15] [options]
#
# Scenarios (bench/README.md says what each measures and how to read its report):
#   throughput slow-destination dead-destination contention bloat all
#     run by bench/harness (python -m bench.harness): each starts a durable embedded
#     PostgreSQL unless --dsn, the engine, fake destinations and locust as it needs,
#     shows a live progress bar and writes bench/reports/<UTC time>-<scenario>/.
#   drain-fast drain-slow peers ingress claim-latency completion-strategy
#     the older single-purpose scripts, unchanged (their own --help).
# --stock-pg15 runs the scenario against a throwaway Debian PostgreSQL 15 cluster with
# stock settings (JIT on) instead of the embedded PostgreSQL 18.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario="${1:-throughput}"
[ $# -gt 0 ] && shift

# The harness, drain.py and peers.py take --stock-pg15 themselves (bench/benchdb.py starts
# the cluster); the older scripts without it run under tools/with-pg15.sh instead.
args=()
stock_pg15=0
for arg in "$@"; do
    if [ "$arg" = "--stock-pg15" ]; then stock_pg15=1; else args+=("$arg"); fi
done
own=()
[ "$stock_pg15" = 1 ] && own=(--stock-pg15)
if ! python -c 'import engine, psycopg' 2>/dev/null; then
    echo "bench/run.sh: the engine's Python packages are missing; install them: pip install -e '.[bench]'" >&2
    exit 2
fi
run() {
    if [ "$stock_pg15" = 1 ]; then
        if [ ! -x /usr/lib/postgresql/15/bin/initdb ]; then
            echo "bench/run.sh: --stock-pg15 needs PostgreSQL 15; install it: apt-get install -y postgresql-15" >&2
            exit 2
        fi
        # with-pg15.sh exports ENGINE_TEST_DSN for the cluster it starts and removes after.
        bash tools/with-pg15.sh bash -c '"$@" --dsn "$ENGINE_TEST_DSN"' run "$@"
    else
        "$@"
    fi
}
case "$scenario" in
    throughput|slow-destination|dead-destination|contention|bloat|all)
        python -m bench.harness "$scenario" ${own[@]+"${own[@]}"} ${args[@]+"${args[@]}"} ;;
    drain-fast|drain-slow)
                         python bench/drain.py "$scenario" ${own[@]+"${own[@]}"} ${args[@]+"${args[@]}"} ;;
    ingress)             run python bench/ingress.py ${args[@]+"${args[@]}"} ;;
    peers)               python bench/peers.py ${own[@]+"${own[@]}"} ${args[@]+"${args[@]}"} ;;
    claim-latency)       run python bench/claim_latency.py ${args[@]+"${args[@]}"} ;;
    completion-strategy) run python bench/completion_strategy.py ${args[@]+"${args[@]}"} ;;
    -h|--help)           python -m bench.harness --help
                         echo "also: drain-fast drain-slow peers ingress claim-latency completion-strategy" ;;
    *)
        echo "bench/run.sh: unknown scenario '$scenario'" >&2
        echo "scenarios: throughput slow-destination dead-destination contention bloat all" \
             "drain-fast drain-slow ingress peers claim-latency completion-strategy" >&2
        exit 2 ;;
esac

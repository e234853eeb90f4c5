#!/usr/bin/env bash
# bench/run.sh [scenario] [extra args for that scenario's script]
# Every scenario starts its own durable PostgreSQL (fsync and synchronous_commit on),
# fake destinations and engine, prints a JSON report and writes it under bench/reports/.
# With no scenario, runs `throughput`.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario="${1:-throughput}"
[ $# -gt 0 ] && shift
case "$scenario" in
    throughput)          python bench/drain.py drain-fast "$@"
                         python bench/ingress.py "$@" ;;
    drain-fast)          python bench/drain.py drain-fast "$@" ;;
    drain-slow|slow-destination)
                         python bench/drain.py drain-slow "$@" ;;
    dead-destination)    python bench/dead_destination.py "$@" ;;
    ingress)             python bench/ingress.py "$@" ;;
    peers)               python bench/peers.py "$@" ;;
    claim-latency)       python bench/claim_latency.py "$@" ;;
    completion-strategy) python bench/completion_strategy.py "$@" ;;
    *)
        echo "bench/run.sh: unknown scenario '$scenario'" >&2
        echo "scenarios: throughput drain-fast drain-slow slow-destination dead-destination" \
             "ingress peers claim-latency completion-strategy" >&2
        exit 2 ;;
esac

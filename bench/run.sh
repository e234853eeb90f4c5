#!/usr/bin/env bash
# bench/run.sh SCENARIO [options]: `python -m bench SCENARIO [options]` run from the
# repository root, once the engine's Python packages are known to be installed.
# `bench/run.sh --help` lists the scenarios; bench/README.md says what each measures.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python -c 'import engine, psycopg' 2>/dev/null; then
    echo "bench/run.sh: the engine's Python packages are missing; install them: pip install -e '.[bench]'" >&2
    exit 2
fi
exec python -m bench "$@"

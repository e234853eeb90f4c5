#!/usr/bin/env bash
# The system packages engine needs, installed with apt-get when missing (Debian 12 and
# its derivatives); the README's command lines call this before `pip install`.
#
#   bash tools/setup.sh        what `pip install -e .` needs to build psycopg[c]:
#                              pg_config (libpq-dev), a C compiler (gcc), Python.h
#   bash tools/setup.sh test   and what the test suite runs: node (the fake destinations),
#                              chromium (the console's browser tests), curl (the README's
#                              examples), openssl, ip (iproute2), PostgreSQL 15 (CI's
#                              second run, tools/with-pg15.sh)
#   bash tools/setup.sh bench  and what bench/ runs besides Python: node, PostgreSQL 15
#                              (--stock-pg15, and its pgbench: ingest-ceiling), wrk (the
#                              load tool of ingest-ceiling and the ingress scenario)
#   bash tools/setup.sh container  podman, runc and debootstrap: the container test
#                              (tests/test_container.py builds the image on a base image
#                              made here by tools/container-base.sh)
#
# Each need is checked by the command or file it provides, so a machine that has it from
# elsewhere (node from NodeSource, a Python built with its headers) installs nothing.
# Without root it uses sudo; without either it names the packages and exits 1.
set -euo pipefail

python_headers() {
    python3 - <<'EOF'
import os, sysconfig
raise SystemExit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
EOF
}

missing=()
need_command() {  # need_command COMMAND PACKAGE...
    local cmd=$1
    shift
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$@")
}

need_command pg_config libpq-dev
need_command gcc gcc
python_headers || missing+=(python3-dev)
if [ "${1:-}" = test ]; then
    need_command node nodejs
    need_command chromium chromium fonts-dejavu-core
    need_command curl curl
    need_command openssl openssl
    need_command ip iproute2
    [ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
elif [ "${1:-}" = bench ]; then
    need_command node nodejs
    need_command wrk wrk
    [ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
elif [ "${1:-}" = container ]; then
    need_command podman podman
    need_command runc runc
    need_command debootstrap debootstrap
elif [ -n "${1:-}" ]; then
    echo "setup.sh: unknown argument '$1' (none, 'test', 'bench' or 'container')" >&2
    exit 2
fi

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "setup.sh: installing ${missing[*]}" >&2
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup.sh: no apt-get here; install the equivalents of: ${missing[*]}" >&2
    exit 1
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "setup.sh: installing needs root; as root run: apt-get install ${missing[*]}" >&2
        exit 1
    fi
    as_root=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# Run a command against a throwaway PostgreSQL 15 cluster from Debian's postgresql-15:
#   tools/with-pg15.sh python -m pytest -q -m pg_versions
# The cluster runs as the `postgres` user (PostgreSQL refuses root), listens on loopback
# only, and is stopped and deleted when the command ends. ENGINE_TEST_DSN points at it, and
# ENGINE_TEST_PG_MAJOR=15 makes the test session check that the server it reached is 15.
set -euo pipefail
BIN="$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)"
[ -x "$BIN/initdb" ] || BIN=/usr/lib/postgresql/15/bin
if [ ! -x "$BIN/initdb" ]; then
    echo "with-pg15.sh: no PostgreSQL 15 in $BIN (bash tools/setup.sh test installs it)" >&2
    exit 1
fi
DATA="$(mktemp -d /tmp/engine-pg15.XXXXXX)"
PORT="${PG15_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
AS=()
if [ "$(id -u)" = 0 ]; then
    chown postgres "$DATA"
    AS=(runuser -u postgres --)
fi
stop() {
    "${AS[@]}" "$BIN/pg_ctl" -D "$DATA/db" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$DATA"
}
trap stop EXIT
"${AS[@]}" "$BIN/initdb" -D "$DATA/db" -U postgres --auth=trust -E UTF8 >/dev/null
"${AS[@]}" "$BIN/pg_ctl" -D "$DATA/db" -w -l "$DATA/server.log" \
    -o "-c listen_addresses=127.0.0.1 -c port=$PORT -c unix_socket_directories='' -c max_connections=200" \
    start >/dev/null
export ENGINE_TEST_DSN="postgresql://postgres@127.0.0.1:$PORT/postgres"
export ENGINE_TEST_PG_MAJOR=15
"$@"

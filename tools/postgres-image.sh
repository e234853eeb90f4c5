#!/usr/bin/env bash
# tools/postgres-image.sh [NAME]: a PostgreSQL image for compose.yaml built here, where
# the public postgres image cannot be pulled (tools/postgres/Containerfile: Debian
# bookworm's postgresql-15 on tools/container-base.sh's base). Prints the image's name;
# use it as POSTGRES_IMAGE:
#   POSTGRES_IMAGE=$(bash tools/postgres-image.sh) podman-compose up
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${1:-localhost/engine-postgres:15-bookworm}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/tools/podman/containers.conf}
export CONTAINERS_STORAGE_CONF=${CONTAINERS_STORAGE_CONF:-$PWD/tools/podman/storage.conf}
if podman image exists "$NAME"; then
    echo "$NAME"
    exit 0
fi
BASE=$(bash tools/container-base.sh | tail -1)
podman build --format docker --network=host --build-arg "BASE=$BASE" -t "$NAME" \
    tools/postgres >&2
echo "$NAME"

#!/usr/bin/env bash
# tools/container-base.sh [NAME]: a Debian bookworm base image with Python 3.11 made
# here, for the Containerfile's BASE build argument where no image registry is
# reachable (debootstrap from the Debian mirror apt already uses, then `podman import`).
# Prints the image's name. Needs root, debootstrap and podman (apt-get install them).
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${1:-localhost/engine-base:bookworm}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/tools/podman/containers.conf}
export CONTAINERS_STORAGE_CONF=${CONTAINERS_STORAGE_CONF:-$PWD/tools/podman/storage.conf}
if podman image exists "$NAME"; then
    echo "$NAME"
    exit 0
fi
for tool in debootstrap podman; do
    command -v "$tool" >/dev/null || { echo "container-base.sh: $tool is missing: apt-get install $tool" >&2; exit 2; }
done
MIRROR=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$ROOT" "$MIRROR" >&2
# apt inside the image reads the same mirror; its lists are fetched by the build.
echo "deb $MIRROR bookworm main" > "$ROOT/etc/apt/sources.list"
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/archives/*.deb
tar -C "$ROOT" -c . | podman import --change 'CMD ["/bin/bash"]' - "$NAME" >&2
echo "$NAME"

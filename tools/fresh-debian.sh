#!/usr/bin/env bash
# The README's Quickstart and test command lines, verbatim, in a fresh clone inside a
# minimal Debian 12 (debootstrap --variant=minbase bookworm, plus python3 python3-venv
# python3-pip git ca-certificates and nothing else), entered with chroot, as root:
#
#   bash tools/fresh-debian.sh [--base ROOTFS.tgz] [--keep] [--quickstart-only]
#
# It proves that the project installs what it needs from its own files. --base reuses a
# tarball of such a root made before (its top folder is the root); --keep leaves the root
# in place; --quickstart-only runs the first line alone. The lines' output goes to
# fresh-debian-{quickstart,tests}.log in the current folder. Needs root and debootstrap;
# the mirror is the one this machine's apt names.
set -euo pipefail
SOURCE="$(cd "$(dirname "$0")/.." && pwd)"
BASE=""
KEEP=0
ONLY_QUICKSTART=0
while [ $# -gt 0 ]; do
    case "$1" in
        --base) BASE="$2"; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --quickstart-only) ONLY_QUICKSTART=1; shift ;;
        *) echo "fresh-debian.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "fresh-debian.sh: needs root (debootstrap, chroot)" >&2; exit 1; }

# The two lines as the README writes them (tests/test_readme.py keeps them in step).
QUICKSTART="$(grep -m1 '^    python3 -m venv .venv' "$SOURCE/README.md" | sed 's/^    //')"
TESTS="$(grep -m1 '^    bash tools/setup.sh test' "$SOURCE/README.md" | sed 's/^    //')"

WORK="$(mktemp -d /var/tmp/engine-fresh.XXXXXX)"
ROOTFS="$WORK/rootfs"
mounted=()
cleanup() {
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount -l "${mounted[$i]}" 2>/dev/null || true
    done
    if [ "$KEEP" = 0 ]; then rm -rf --one-file-system "$WORK"; else echo "kept $ROOTFS" >&2; fi
}
trap cleanup EXIT

if [ -n "$BASE" ]; then
    mkdir "$ROOTFS"
    tar -C "$ROOTFS" --strip-components=1 -xzf "$BASE"
else
    MIRROR="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources \
              2>/dev/null || true)"
    debootstrap --variant=minbase bookworm "$ROOTFS" "${MIRROR:-http://deb.debian.org/debian}"
    cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
    chroot "$ROOTFS" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive chroot "$ROOTFS" apt-get install -y -qq \
        --no-install-recommends python3 python3-venv python3-pip git ca-certificates
fi
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
# A network that inspects TLS (a company's egress proxy) has its CA in the host's store:
# the chroot trusts what the host trusts, and gets the host's CA variables below.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
    chroot "$ROOTFS" update-ca-certificates >/dev/null
fi
ca_env=()
for name in SSL_CERT_FILE PIP_CERT REQUESTS_CA_BUNDLE CURL_CA_BUNDLE NODE_EXTRA_CA_CERTS; do
    if [ -n "${!name:-}" ]; then ca_env+=("$name=${!name}"); fi
done
# As in any chroot, packages may not start services (postgresql-15's cluster, say).
printf '#!/bin/sh\nexit 101\n' > "$ROOTFS/usr/sbin/policy-rc.d"
chmod +x "$ROOTFS/usr/sbin/policy-rc.d"

bind() {  # bind SOURCE TARGET [mount options...]
    mkdir -p "$2"
    mount "${@:3}" "$1" "$2"
    mounted+=("$2")
}
# The root a mount point of its own, as a machine's is (unshare --propagation needs it).
bind "$ROOTFS" "$ROOTFS" --bind
bind proc "$ROOTFS/proc" -t proc
bind sysfs "$ROOTFS/sys" -t sysfs
bind /dev "$ROOTFS/dev" --rbind
bind tmpfs "$ROOTFS/dev/shm" -t tmpfs
bind tmpfs "$ROOTFS/run" -t tmpfs
bind "$SOURCE" "$ROOTFS/mnt/source" --bind -o ro

chroot "$ROOTFS" git config --global --add safe.directory /mnt/source
chroot "$ROOTFS" git clone -q /mnt/source /root/engine
run() {  # run NAME LINE: the line in the clone, timed, its output to a log
    local log="fresh-debian-$1.log" started
    started=$(date +%s)
    set +e
    chroot "$ROOTFS" /usr/bin/env -i HOME=/root TERM=dumb PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        "${ca_env[@]}" bash -c "cd /root/engine && $2" >"$log" 2>&1
    local rc=$?
    set -e
    echo "$1: exit $rc after $(( $(date +%s) - started )) s; the last lines of $log:"
    tail -n 15 "$log"
    return $rc
}
# The test line runs in the shell the Quickstart left: its venv activated.
run quickstart "$QUICKSTART"
[ "$ONLY_QUICKSTART" = 1 ] && exit 0
run tests ". .venv/bin/activate && $TESTS"

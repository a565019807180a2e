#!/usr/bin/env bash
# Makes a Debian bookworm base image without a registry, for machines that cannot pull
# from Docker Hub: debootstrap (minbase) from the machine's configured Debian mirror into
# a folder, then `docker import` under the tag the Dockerfiles name (docker/versions.env's
# CPU_BASE_IMAGE, e.g. debian:12.12-slim), so docker/build.sh and a plain `docker build`
# use it as they would use the official image. The stand-in carries the label
# org.opencontainers.image.description="local debootstrap of bookworm" to tell it apart.
#
# usage: make-debian-base.sh [IMAGE_TAG [MIRROR_URL]]
# Does nothing when IMAGE_TAG is already in the engine (DOCKER_HOST).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tag=${1:-$(sed -n 's/^CPU_BASE_IMAGE=//p' "$repo_root/docker/versions.env")}
mirror=${2:-}
[ -n "$tag" ] || { echo "make-debian-base: no IMAGE_TAG and no CPU_BASE_IMAGE in docker/versions.env" >&2; exit 2; }

if docker image inspect "$tag" >/dev/null 2>&1; then
    exit 0
fi
command -v debootstrap >/dev/null || {
    echo "make-debian-base: debootstrap is missing (apt-get install debootstrap)" >&2
    exit 1
}

if [ -z "$mirror" ]; then
    # The machine's configured mirror: the first URI serving the bookworm suite,
    # from deb822 sources or a classic sources.list.
    mirror=$(awk '
        /^URIs:/ {uri=$2}
        /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm" && uri != "") { print uri; exit } }
        /^deb / { for (i = 2; i <= NF; i++) if ($i == "bookworm") { print $(i-1); exit } }
    ' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n1)
fi
if [ -z "$mirror" ]; then
    echo "make-debian-base: no Debian mirror for bookworm found in /etc/apt; pass MIRROR_URL" >&2
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/byoc-debootstrap.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
rootfs="$work/rootfs"

echo "make-debian-base: debootstrap bookworm from $mirror" >&2
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    exit 1
}

# Like the official image: the same mirror for updates and security, apt lists and
# caches emptied, no machine-id.
cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
rm -f "$rootfs/etc/apt/sources.list"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
: >"$rootfs/etc/machine-id"

tar --numeric-owner -C "$rootfs" -c . | docker import \
    --change 'CMD ["bash"]' \
    --change 'LABEL org.opencontainers.image.description="local debootstrap of bookworm"' \
    - "$tag" >/dev/null
echo "make-debian-base: imported $tag" >&2

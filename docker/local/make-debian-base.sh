#!/usr/bin/env bash
# Makes a Debian bookworm base image without a registry: debootstrap (minbase) from the
# machine's configured Debian mirror into a folder, then `podman import` into a private
# image store. The image stands in for debian:bookworm-slim when building
# docker/Dockerfile.cpu on a machine with no Docker engine and no registry access.
#
# usage: make-debian-base.sh STORE_ROOT RUN_ROOT IMAGE_TAG [MIRROR_URL]
#   STORE_ROOT/RUN_ROOT: podman/buildah --root/--runroot (a private store, never the
#   machine's default one); IMAGE_TAG e.g. localhost/debian:bookworm.
# Does nothing when IMAGE_TAG is already in the store.
set -euo pipefail

if (($# < 3 || $# > 4)); then
    echo "usage: $0 STORE_ROOT RUN_ROOT IMAGE_TAG [MIRROR_URL]" >&2
    exit 2
fi
store_root=$1
run_root=$2
tag=$3
mirror=${4:-}

podman_store=(--root "$store_root" --runroot "$run_root" --storage-driver overlay)

if podman "${podman_store[@]}" image exists "$tag"; then
    exit 0
fi

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

echo "make-debian-base: debootstrap bookworm from $mirror"
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

tar --numeric-owner -C "$rootfs" -cf "$work/rootfs.tar" .
podman "${podman_store[@]}" import --change 'CMD ["bash"]' "$work/rootfs.tar" "$tag" >/dev/null
echo "make-debian-base: imported $tag"

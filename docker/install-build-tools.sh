#!/usr/bin/env bash
# Installs what building and running the images without a Docker engine needs on a
# Debian 12 machine (see docs/images.md): buildah builds, podman imports and runs,
# debootstrap makes the Debian base, uidmap/fuse-overlayfs/crun back them, iproute2
# makes the emulated hosts. Idempotent: installs only what is missing; needs root.
set -euo pipefail

packages=(buildah podman debootstrap uidmap fuse-overlayfs crun slirp4netns
          containernetworking-plugins iproute2 util-linux tar ca-certificates)

missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]} == 0)); then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-build-tools: need root to apt-get install: ${missing[*]}" >&2
    exit 1
fi
echo "install-build-tools: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

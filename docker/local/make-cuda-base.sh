#!/usr/bin/env bash
# Makes stand-ins for the nvidia/cuda base images that Dockerfile.gpu builds on, for machines
# that cannot pull them (no Docker Hub, no NVIDIA apt repository): Debian 12 (the stand-in
# Debian base, docker/local/make-debian-base.sh) plus NVIDIA's CUDA wheels from PyPI, laid out
# as nvidia/cuda lays CUDA out (docker/local/Dockerfile.cuda-base, lay-out-cuda.py). The CUDA
# release is the one docker/versions.env's GPU_BASE_IMAGE names (nvidia/cuda:13.0.2-… →
# cuda-toolkit==13.0.2). What differs from the real bases: docs/images.md.
#
# usage: make-cuda-base.sh [--flavor base|devel|runtime]... [--no-cache]   (default: base and devel)
# Prints one line per flavour, `FLAVOR TAG`, on stdout: byoc-local/cuda:<version>-<flavor>-debian12.
# Docker's layer cache makes a second run seconds. Env: DOCKER_HOST (the engine to use).
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo_root"

flavors=() no_cache=()
while (($#)); do
    case "$1" in
        --flavor) flavors+=("${2:?--flavor needs base, devel or runtime}"); shift 2 ;;
        --no-cache) no_cache=(--no-cache); shift ;;
        *) echo "make-cuda-base: unknown argument $1" >&2; exit 2 ;;
    esac
done
((${#flavors[@]})) || flavors=(base devel)
for flavor in "${flavors[@]}"; do
    case "$flavor" in base|devel|runtime) ;; *) echo "make-cuda-base: no flavour '$flavor'" >&2; exit 2 ;; esac
done

pinned=$(sed -n 's/^GPU_BASE_IMAGE=//p' docker/versions.env)
version=$(sed -n 's|^nvidia/cuda:\([0-9][0-9.]*\)-.*|\1|p' <<<"$pinned")
[ -n "$version" ] || { echo "make-cuda-base: GPU_BASE_IMAGE ($pinned) is not an nvidia/cuda tag" >&2; exit 1; }
debian=$(sed -n 's/^CPU_BASE_IMAGE=//p' docker/versions.env)
if ! docker image inspect "$debian" >/dev/null 2>&1; then
    bash docker/local/make-debian-base.sh "$debian"
fi
# shellcheck source=scripts/lib/build-local.sh
source scripts/lib/build-local.sh
write_build_local

for flavor in "${flavors[@]}"; do
    tag="byoc-local/cuda:$version-$flavor-debian12"
    echo "make-cuda-base: $tag (cuda-toolkit==$version wheels on $debian)" >&2
    # The legacy builder, as docker/build.sh uses here; the host network (no iptables here).
    DOCKER_BUILDKIT=0 docker build -q --network host --file docker/local/Dockerfile.cuda-base \
        --target "$flavor" --build-arg "DEBIAN_IMAGE=$debian" --build-arg "CUDA_TOOLKIT_VERSION=$version" \
        --tag "$tag" "${no_cache[@]}" . >&2
    echo "$flavor $tag"
done

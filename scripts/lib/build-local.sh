# shellcheck shell=bash
# docker/build-local/: what this machine adds to an image build's builder stages (never a
# layer of the final image; docker/build-local/README.md). Rewritten before each build from
# this machine's pip settings (cheap; an unchanged result keeps Docker's layer cache).
# Sourced by scripts/build-local-image.sh (the CPU image), docker/local/make-cuda-base.sh and
# scripts/check-gpu-image.sh (the GPU image and its stand-in base).
#
#   write_build_local [TORCH_WHEEL_GLOB]
#     writes pip.conf (and ca.crt: the CA bundle this machine's pip trusts, when it has one);
#     with TORCH_WHEEL_GLOB (e.g. 'torch-2.13.0+cpu-*.whl'), also links the matching wheels
#     of pip's find-links folders into wheels/ and names that folder in pip.conf. Without it,
#     wheels/ is emptied: the GPU build must take PyPI's CUDA torch, and `torch==2.13.0` would
#     also match a local `2.13.0+cpu` wheel (pip prefers it).
#     Sets BUILD_LOCAL_HAS_WHEELS=1 when wheels/ holds any.

write_build_local() {
    local want=${1:-} repo dir cert find_links folder wheel
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    dir=$repo/docker/build-local
    # One build of this checkout at a time uses docker/build-local/: the lock is taken here and
    # held until the calling script ends (its build has read the folder by then). Two at once
    # (the test suite's workers) wrote one pip.conf together: `find-links` twice, pip refused it.
    mkdir -p "$repo/.work"
    exec {BUILD_LOCAL_LOCK_FD}>"$repo/.work/build-local.lock"
    flock "$BUILD_LOCAL_LOCK_FD"
    find "$dir" -mindepth 1 ! -name README.md -delete
    cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
    find_links=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}
    {
        echo "[global]"
        if [ -n "$cert" ] && [ -f "$cert" ]; then
            cp "$cert" "$dir/ca.crt"
            echo "cert = /opt/byoc-build-local/ca.crt"
        fi
    } >"$dir/pip.conf"
    # shellcheck disable=SC2034  # read by the scripts that source this file
    BUILD_LOCAL_HAS_WHEELS=0
    [ -n "$want" ] || return 0
    for folder in $find_links; do
        for wheel in "$folder"/$want; do
            [ -f "$wheel" ] || continue
            mkdir -p "$dir/wheels"
            ln -f "$wheel" "$dir/wheels/" 2>/dev/null || cp "$wheel" "$dir/wheels/"
        done
    done
    if [ -d "$dir/wheels" ]; then
        echo "find-links = /opt/byoc-build-local/wheels" >>"$dir/pip.conf"
        # shellcheck disable=SC2034  # read by the scripts that source this file
        BUILD_LOCAL_HAS_WHEELS=1
    fi
}

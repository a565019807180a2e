#!/usr/bin/env bash
# Builds Horovod 0.28.1 as a wheel that works with torch >= 2.1, into a wheelhouse.
#
# Why: Horovod 0.28.1 pins C++14 in its CMake files, and PyTorch >= 2.1 headers need
# C++17 ("C++17 or later compatible compiler is required"). CXXFLAGS does not help (its
# CMake strips -std flags), so we patch the CMAKE_CXX_STANDARD lines in the sdist.
#
# Usage:  bash scripts/build-horovod-wheel.sh
# Env:    BYOC_WHEELHOUSE  where the wheel goes (default $HOME/.cache/byoc-wheelhouse)
#         PYTHON           the interpreter whose torch Horovod builds against (default .venv/bin/python)
#         HOROVOD_GPU_OPERATIONS=NCCL on a CUDA image (passed through to Horovod's build)
# Then:   .venv/bin/python -m pip install --find-links "$BYOC_WHEELHOUSE" -e '.[test,horovod]'
#
# Idempotent: when a horovod-0.28.1 wheel is already in the wheelhouse, nothing is built.
# scripts/bootstrap.sh no longer uses this: it runs docker/scripts/install-horovod.sh against
# .venv, which shares its wheel with the CPU image (docker/wheelhouse/README.md). This stays
# for venvs with other pins (e.g. HOROVOD_GPU_OPERATIONS=NCCL on a GPU machine).
set -euo pipefail

horovod_version=0.28.1
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheelhouse="${BYOC_WHEELHOUSE:-$HOME/.cache/byoc-wheelhouse}"
python_bin="${PYTHON:-$repo_root/.venv/bin/python}"

mkdir -p "$wheelhouse"
shopt -s nullglob
existing=("$wheelhouse"/horovod-"$horovod_version"-*.whl)
if ((${#existing[@]})); then
    echo "build-horovod-wheel: already built: ${existing[0]}"
    exit 0
fi

"$python_bin" -c 'import torch' || {
    echo "build-horovod-wheel: $python_bin has no torch; run scripts/bootstrap.sh first" >&2
    exit 1
}
for tool in cmake g++ make mpicxx; do
    command -v "$tool" >/dev/null || {
        echo "build-horovod-wheel: '$tool' not found (apt-get install cmake g++ make libopenmpi-dev)" >&2
        exit 1
    }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "build-horovod-wheel: downloading the horovod $horovod_version sdist"
# (The grep drops pip's notes about index folders that this machine's pip.conf names but lacks.)
"$python_bin" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    --no-build-isolation "horovod==$horovod_version" -d "$work/sdist" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
tar -xzf "$work"/sdist/horovod-"$horovod_version".tar.gz -C "$work"
src="$work/horovod-$horovod_version"

# The C++17 fix: Horovod's own two "CMAKE_CXX_STANDARD 14" lines become 17
# (third_party/ is left as shipped).
mapfile -t pinned < <(grep -l 'CMAKE_CXX_STANDARD 14' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt")
if ((${#pinned[@]} == 0)); then
    echo "build-horovod-wheel: no 'CMAKE_CXX_STANDARD 14' line found in the sdist; the fix no longer applies" >&2
    exit 1
fi
sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "${pinned[@]}"
echo "build-horovod-wheel: patched C++ standard to 17 in: ${pinned[*]#"$src"/}"

echo "build-horovod-wheel: building (several minutes on 2 cores)"
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
MAKEFLAGS="-j$(nproc)" \
    "$python_bin" -m pip wheel --disable-pip-version-check --no-deps --no-build-isolation \
    -w "$work/wheels" "$src"

# Move in with a rename so a wheelhouse never holds a half-written wheel.
for whl in "$work"/wheels/horovod-*.whl; do
    cp "$whl" "$wheelhouse/.$(basename "$whl").partial"
    mv "$wheelhouse/.$(basename "$whl").partial" "$wheelhouse/$(basename "$whl")"
    echo "build-horovod-wheel: wrote $wheelhouse/$(basename "$whl")"
done

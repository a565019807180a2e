#!/usr/bin/env bash
# Horovod built from its sdist with PyTorch, MPI and Gloo (and NCCL ops when
# HOROVOD_GPU_OPERATIONS=NCCL). Horovod 0.28.1 pins C++14 in its CMake files while
# PyTorch >= 2.1 headers need C++17, and its CMake strips -std flags from CXXFLAGS, so
# the two `CMAKE_CXX_STANDARD 14` lines of the sdist become 17 before the build.
# Ends with `horovodrun --check-build`, asserting what was built.
set -euo pipefail
: "${PYPI_HOROVOD_VERSION:?from docker/versions.env}"

work=$(mktemp -d)
trap 'rm -rf -- "$work"' EXIT
python3 -m pip download --no-cache-dir -q --no-deps --no-binary :all: \
    "horovod==$PYPI_HOROVOD_VERSION" -d "$work"
tar -xzf "$work/horovod-$PYPI_HOROVOD_VERSION.tar.gz" -C "$work"
src="$work/horovod-$PYPI_HOROVOD_VERSION"

mapfile -t pinned < <(grep -l 'CMAKE_CXX_STANDARD 14' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt" || true)
if ((${#pinned[@]} != 2)); then
    echo "install-horovod: expected 'CMAKE_CXX_STANDARD 14' in both CMake files, found: ${pinned[*]:-none}" >&2
    exit 1
fi
sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "${pinned[@]}"

if [ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ]; then
    # Build against the NCCL that torch's CUDA wheels brought (nvidia-nccl-cu*), so one
    # process never holds two NCCLs. The wheel ships only libnccl.so.2: link name added.
    nccl_lib=$(python3 -c 'import glob, os, sysconfig
hits = glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "**", "libnccl.so.2"), recursive=True)
print(sorted(hits)[0] if hits else "")')
    if [ -z "$nccl_lib" ]; then
        echo "install-horovod: no libnccl.so.2 from torch's nvidia-nccl wheel in the venv" >&2
        exit 1
    fi
    nccl_home=$(dirname "$(dirname "$nccl_lib")")
    [ -f "$nccl_home/include/nccl.h" ] || { echo "install-horovod: no nccl.h under $nccl_home" >&2; exit 1; }
    ln -sf libnccl.so.2 "$nccl_home/lib/libnccl.so"
    export HOROVOD_NCCL_HOME=$nccl_home HOROVOD_NCCL_LINK=SHARED
    export HOROVOD_CUDA_HOME=${HOROVOD_CUDA_HOME:-/usr/local/cuda}
    if [ -z "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]; then
        echo "install-horovod: HOROVOD_BUILD_CUDA_CC_LIST (from docker/versions.env) is empty" >&2
        exit 1
    fi
    export HOROVOD_BUILD_CUDA_CC_LIST
fi

HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 MAKEFLAGS="-j$(nproc)" \
    python3 -m pip install --no-cache-dir -q --no-build-isolation "$src"

# The check: what horovodrun says was built.
report=$(horovodrun --check-build)
echo "$report"
want=("[X] PyTorch" "[X] MPI" "[X] Gloo")
if [ "${HOROVOD_GPU_OPERATIONS:-}" = "NCCL" ]; then
    want+=("[X] NCCL")
fi
for line in "${want[@]}"; do
    grep -qF "$line" <<<"$report" || { echo "install-horovod: '$line' missing from --check-build" >&2; exit 1; }
done
python3 -c 'import horovod.torch as hvd; print("install-horovod: horovod.torch imports")'

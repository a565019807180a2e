#!/usr/bin/env bash
# Horovod built from its sdist with PyTorch, MPI and Gloo (and NCCL ops when
# HOROVOD_GPU_OPERATIONS=NCCL). Horovod 0.28.1 pins C++14 in its CMake files while
# PyTorch >= 2.1 headers need C++17, and its CMake strips -std flags from CXXFLAGS, so
# the two `CMAKE_CXX_STANDARD 14` lines of the sdist become 17 before the build; its
# setup.py builds RelWithDebInfo, made Release (no debug information) the same way.
#
# The compile is most of an uncached image build (minutes on 2 cores; far more with CUDA),
# and Docker's layer cache loses it whenever any earlier layer changes. So the wheel is
# kept, keyed by what it was built against ("build facts": this script, Horovod's version,
# the CPython ABI, torch and its C++ ABI, Open MPI, the compiler, cmake, glibc, NCCL and nvcc): a
# wheel in $WHEELHOUSE_IN whose recorded facts equal this build's is installed instead of
# compiled. Every build leaves its wheel and facts in $WHEELS_OUT, which the Dockerfile's
# `wheelhouse` stage exports (docker/build.sh --wheelhouse DIR; docker/wheelhouse/README.md).
# scripts/bootstrap.sh runs this same script against the development venv (python3, pip and
# horovodrun from .venv/bin first on PATH), so a machine compiles Horovod once for both;
# HOROVOD_WHEEL_ONLY=1 stops after the wheel (no install, no check).
# Ends with `horovodrun --check-build`, asserting what was built or reused.
set -euo pipefail
: "${PYPI_HOROVOD_VERSION:?from docker/versions.env}"
WHEELHOUSE_IN=${WHEELHOUSE_IN:-/opt/byoc-wheelhouse}
WHEELS_OUT=${WHEELS_OUT:-/opt/byoc-wheels-built}

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

# The build facts, one a line: a change in any of them means a new wheel.
build_facts() {
    echo "install-horovod.sh $(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
    echo "horovod $PYPI_HOROVOD_VERSION"
    echo "gpu-operations ${HOROVOD_GPU_OPERATIONS:-none} ${HOROVOD_BUILD_CUDA_CC_LIST:-}"
    python3 - <<'PY'
import sys, sysconfig
import torch
# The CPython ABI, not the patch release: an extension built for 3.11.x loads in any 3.11,
# so the development venv (whatever 3.11 it has) and the image share one wheel.
print("python", sysconfig.get_config_var("SOABI"), sysconfig.get_platform())
print("torch", torch.__version__, "cxx11abi", int(torch.compiled_with_cxx11_abi()), "cuda", torch.version.cuda)
PY
    echo "mpi $(mpirun --version 2>&1 | head -n1)"
    echo "c++ $(c++ --version | head -n1)"
    echo "cmake $(cmake --version | head -n1)"
    echo "glibc $(ldd --version | head -n1)"
    if [ -n "${HOROVOD_NCCL_HOME:-}" ]; then
        echo "nccl.h $(sha256sum "$HOROVOD_NCCL_HOME/include/nccl.h" | cut -d' ' -f1)"
        echo "nvcc $( ("$HOROVOD_CUDA_HOME/bin/nvcc" --version 2>/dev/null || true) | tail -n1)"
    fi
}

facts=$(build_facts)
key=$(sha256sum <<<"$facts" | cut -c1-16)
entry=horovod-$PYPI_HOROVOD_VERSION-$key
out="$WHEELS_OUT/$entry"
mkdir -p "$out"
printf '%s\n' "$facts" >"$out/build-facts.txt"
kept=("$WHEELHOUSE_IN/$entry/horovod-$PYPI_HOROVOD_VERSION"-*.whl)
if [ -f "${kept[0]}" ] && cmp -s "$WHEELHOUSE_IN/$entry/build-facts.txt" "$out/build-facts.txt"; then
    echo "install-horovod: reusing the kept wheel $entry (built for these facts): no compile"
    cp "${kept[0]}" "$out/"
else
    echo "install-horovod: no kept wheel for $entry in $WHEELHOUSE_IN: building from source for"
    printf '  %s\n' "${facts//$'\n'/$'\n'  }"
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
    # Release (-O3, as Horovod's RelWithDebInfo) without -g: slim-venv.sh strips the debug
    # information anyway, and making it costs ~15% of the compile (226 s -> 195 s on 2 cores)
    # and 19 of the wheel's 20 MB.
    if ! grep -q "else 'RelWithDebInfo'" "$src/setup.py"; then
        echo "install-horovod: expected setup.py to choose 'RelWithDebInfo'" >&2
        exit 1
    fi
    sed -i "s/else 'RelWithDebInfo'/else 'Release'/" "$src/setup.py"

    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 MAKEFLAGS="-j$(nproc)" \
        python3 -m pip wheel --no-cache-dir -q --no-deps --no-build-isolation -w "$out" "$src"
fi
if [ "${HOROVOD_WHEEL_ONLY:-0}" = 1 ]; then
    # scripts/bootstrap.sh: the wheel now, beside other installs into the same venv; the
    # install (this script again, reusing the wheel) once they have ended.
    echo "install-horovod: the wheel only, in $out (HOROVOD_WHEEL_ONLY=1)"
    exit 0
fi
python3 -m pip install --no-cache-dir -q "$out/horovod-$PYPI_HOROVOD_VERSION"-*.whl

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

#!/usr/bin/env bash
# The CUDA runtime pieces the GPU image relies on beyond what the nvidia/cuda runtime base
# gives, derived from the base image itself (CUDA_VERSION, set by nvidia/cuda), no number
# kept here:
#  - the unversioned libcudart.so: aws-ofi-nccl (built --enable-cudart-dynamic, as AWS's
#    packages are) dlopen()s "libcudart.so", which only the -devel images have; without it the
#    plugin fails with "Failed to find CUDA Runtime library" (aws-ofi-nccl#244);
#  - CUDA forward compatibility: the cuda-compat libraries (nvidia/cuda installs
#    cuda-compat-<major>-<minor>) must be there, with libcuda.so.1 naming its driver version:
#    the launcher puts them first on LD_LIBRARY_PATH when the host's driver is older
#    (entrypoint/decide/gpu_env.py), as the AWS images' start-up does.
# usage: configure-cuda.sh [CUDA_HOME]   (default /usr/local/cuda; another root for tests,
#        where the loader check is left out)
set -euo pipefail
cuda_home=${1:-/usr/local/cuda}
: "${CUDA_VERSION:?set by the nvidia/cuda base image}"
major=${CUDA_VERSION%%.*}
lib="$cuda_home/lib64"

runtime=$(compgen -G "$lib/libcudart.so.$major" | head -n1 || true)
[ -n "$runtime" ] || { echo "configure-cuda: no libcudart.so.$major in $lib (CUDA $CUDA_VERSION)" >&2; exit 1; }
if [ ! -e "$lib/libcudart.so" ]; then
    ln -s "libcudart.so.$major" "$lib/libcudart.so"
fi

compat_link="$cuda_home/compat/libcuda.so.1"
target=$(readlink "$compat_link" || true)
if [[ ! "$target" =~ ^libcuda\.so\.[0-9]+(\.[0-9]+)+$ ]] || [ ! -e "$cuda_home/compat/$target" ]; then
    echo "configure-cuda: $compat_link does not name a compat libcuda (got '${target}'): is cuda-compat installed?" >&2
    exit 1
fi

# The check: the link resolves; in the image, the loader finds the unversioned name.
test -e "$lib/libcudart.so"
if [ "$cuda_home" = /usr/local/cuda ]; then
    ldconfig
    ldconfig -p | grep -q 'libcudart\.so ' || { echo "configure-cuda: the loader does not find libcudart.so" >&2; exit 1; }
fi
echo "configure-cuda: $lib/libcudart.so -> $(readlink "$lib/libcudart.so"); compat driver ${target#libcuda.so.}"

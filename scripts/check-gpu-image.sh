#!/usr/bin/env bash
# Builds the GPU image (Dockerfile.gpu) on this machine and checks it, end to end, without a
# GPU, Docker Hub, an Ubuntu mirror or the EFA download (docs/images.md, "The GPU image built
# here"):
#   1. the stand-in CUDA bases: docker/local/make-cuda-base.sh (Debian 12 + NVIDIA's CUDA
#      wheels from PyPI, laid out as nvidia/cuda does);
#   2. docker/build.sh --flavor gpu on them with the project's pins, the legacy builder, Docker's
#      layer cache and the Horovod wheel kept in docker/wheelhouse/gpu, and these overrides:
#      GPU_BASE_IMAGE / GPU_BUILDER_IMAGE = the stand-ins, GPU_APT_SNAPSHOT= (Ubuntu's
#      snapshot service serves no Debian), GPU_EFA_INSTALLER_VERSION=none;
#   3-4. tests/images/test_gpu_image.py on the image: the stack with the image's own Python
#      (docker/scripts/check-gpu-stack.py, also the build's last step: torch's CUDA, cuDNN and NCCL,
#      Horovod's NCCL/MPI/Gloo ops, mpi4py's MPI, the compilers), build-versions.env, two MPI
#      ranks, and `train --dry-run` on 2 x ml.p4d.24xlarge with a stand-in nvidia-smi showing 8
#      GPUs (8 processes a host, the NCCL settings, the EFA pre-flight's verdict);
#   5. the local-mode smoke cases under SDK v2 and v3 on this image (tests/localmode, with
#      BYOC_TEST_IMAGE naming it; gloo on the CPU);
#   6. the sizes: uncompressed, and the compressed layers a registry stores (a push to a local
#      registry), largest layers first (docker/image_sizes.py).
# Exits non-zero when a step fails; later steps still run where they can, and the summary
# names each step's result and time.
#
# usage: scripts/check-gpu-image.sh [--tag TAG] [--skip-localmode] [--no-cache]
#   --tag TAG          the image's tag (default byoc-training:gpu-local)
#   --skip-localmode   leave out step 5 (the longest after an uncached build)
#   --no-cache         build the stand-ins and the image without Docker's layer cache (a Horovod
#                      wheel kept in docker/wheelhouse/gpu is still used: move it away to time a compile)
# Logs: .work/setup-logs/ (the build's), .work/gpu-check/ (each step's).
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

tag=byoc-training:gpu-local localmode=1 no_cache=()
while (($#)); do
    case "$1" in
        --tag) tag=${2:?--tag needs a value}; shift 2 ;;
        --skip-localmode) localmode=0; shift ;;
        --no-cache) no_cache=(--no-cache); shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "check-gpu-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

# shellcheck source=scripts/lib/stages.sh
source scripts/lib/stages.sh
logs=$repo_root/.work/gpu-check
mkdir -p "$logs"
eval "$(bash scripts/docker-engine.sh start)"
export DOCKER_HOST
started=$SECONDS
results=()
failed=0
step() {  # step NAME "what" COMMAND...: runs it, logs to $logs/NAME.log, records the result
    local name=$1 what=$2 began=$SECONDS rc=0
    shift 2
    say_stage "$what … (log: $logs/$name.log)"
    "$@" >"$logs/$name.log" 2>&1 || rc=$?
    if ((rc == 0)); then
        results+=("ok    $name ($((SECONDS - began)) s): $what")
    else
        failed=1
        results+=("FAIL  $name ($((SECONDS - began)) s, exit $rc): $what")
        say_stage "FAILED: $what (exit $rc). The last 30 lines of $logs/$name.log:"
        tail -n 30 "$logs/$name.log" | sed 's/^/    /' >&2
    fi
    return "$rc"
}

# shellcheck disable=SC2329  # invoked through step
bases() {
    local line
    while read -r line; do
        case "$line" in
            "base "*) base_image=${line#base } ;;
            "devel "*) builder_image=${line#devel } ;;
        esac
    done < <(bash docker/local/make-cuda-base.sh --flavor base --flavor devel "${no_cache[@]}")
    if [ -z "${base_image:-}" ] || [ -z "${builder_image:-}" ]; then
        echo "make-cuda-base.sh named no base or no devel image"
        return 1
    fi
    echo "stand-ins: $base_image, $builder_image"
}
base_image='' builder_image=''
step bases "the stand-in CUDA bases (Debian 12 + NVIDIA's CUDA wheels)" bases || true

# shellcheck disable=SC2329  # invoked through step
build() {
    # shellcheck source=scripts/lib/build-local.sh
    source scripts/lib/build-local.sh
    write_build_local  # a CA bundle only: the GPU build takes PyPI's CUDA torch
    bash docker/build.sh --flavor gpu --tag "$tag" --builder legacy \
        --set "GPU_BASE_IMAGE=$base_image" --set "GPU_BUILDER_IMAGE=$builder_image" \
        --set GPU_APT_SNAPSHOT= --set GPU_EFA_INSTALLER_VERSION=none \
        --wheelhouse docker/wheelhouse/gpu --log "$BYOC_SETUP_LOGS/image-build-gpu.log" \
        -- --network host "${no_cache[@]}"
}
built=0
if [ -n "$base_image" ] && step build "docker/build.sh --flavor gpu as $tag (uncached: 10-14 min; log: $BYOC_SETUP_LOGS/image-build-gpu.log)" build; then
    built=1
fi

# The local-mode cases the CPU image runs (tests/localmode), on this image: one host, torchrun on
# 2 hosts, MPI on 2 hosts, a failing rank, under SDK v2 and SDK v3.
smoke_cases='one_host or two_hosts_torch_distributed or two_hosts_mpi or failing_script or a_failing_rank'
smoke_cases+=' or two_hosts_torchrun or rank_that_raises'
if ((built)); then
    step image-tests "tests/images/test_gpu_image.py on $tag (the stack with the image's own Python, Horovod and mpi4py, train --dry-run on 2 x ml.p4d.24xlarge)" \
        env BYOC_TEST_IMAGE="$tag" bash scripts/run-tests.sh -p no:cacheprovider -q tests/images/test_gpu_image.py || true
    if ((localmode)); then
        step localmode "the local-mode smoke cases, SDK v2 and v3, on $tag (tests/localmode -k '$smoke_cases')" \
            env BYOC_TEST_IMAGE="$tag" bash scripts/run-tests.sh -p no:cacheprovider -q tests/localmode/test_sdk_v2.py \
            tests/localmode/test_v2_failures.py tests/localmode/test_v3_jobs.py -k "$smoke_cases" || true
    fi
    step sizes "the image's sizes: uncompressed, and compressed as a registry stores it (docker/image_sizes.py)" \
        python3 docker/image_sizes.py "$tag" || true
    sed -n '/^layers of /,$p' "$logs/sizes.log" >&2 || true
fi

echo "check-gpu-image: $tag in $((SECONDS - started)) s" >&2
printf '  %s\n' "${results[@]}" >&2
exit "$failed"

#!/usr/bin/env bash
# Builds the CPU image with Docker on this machine, the way a user would (docker/build.sh),
# plus what this kind of machine needs, and prints the image's tag on stdout.
#   - starts (or reuses) a Docker engine: scripts/docker-engine.sh;
#   - base image: Docker Hub is not reachable here, so docker/local/make-debian-base.sh
#     makes a stand-in under the pinned tag when the engine lacks it;
#   - docker/build-local/ (builder stage only): the CA bundle pip trusts on this machine
#     and the local torch wheel (PIP_FIND_LINKS), so torch's CPU build is not downloaded;
#   - the build runs on the host network (no iptables here, so no NAT for a bridge).
# Docker's layer cache makes an unchanged tree a rebuild of seconds.
# Progress: one line per stage and per build step that runs (scripts/lib/stages.sh,
# docker/build.sh --log); the whole output in .work/setup-logs/image-build-<tag>.log.
#
# usage: scripts/build-local-image.sh [--tag TAG] [--target STAGE] [-- BUILD_SH_ARGS...]
#   --target STAGE   build and tag only the Dockerfile's stages up to STAGE (e.g. builder:
#                    everything before Horovod, for scripts/run-main-job.sh); keeps no
#                    Horovod wheel (only the whole image's build does)
# Env: BYOC_IMAGE_TAG (default byoc-training:cpu-local).
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

tag=${BYOC_IMAGE_TAG:-byoc-training:cpu-local}
target=''
extra=()
while (($#)); do
    case "$1" in
        --tag) tag=${2:?}; shift 2 ;;
        --target) target=${2:?}; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "build-local-image: unknown argument $1" >&2; exit 2 ;;
    esac
done

# shellcheck source=scripts/lib/stages.sh
source scripts/lib/stages.sh
eval "$(bash scripts/docker-engine.sh start)"
export DOCKER_HOST
base=$(sed -n 's/^CPU_BASE_IMAGE=//p' docker/versions.env)
if ! docker image inspect "$base" >/dev/null 2>&1; then
    stage base-image "the Debian 12 base image $base (debootstrap)" bash docker/local/make-debian-base.sh "$base"
fi

# docker/build-local/: this machine's CA bundle and the local CPU torch wheel.
# shellcheck source=scripts/lib/build-local.sh
source scripts/lib/build-local.sh
torch_version=$(sed -n 's/^CPU_TORCH_VERSION=//p' docker/versions.env)
write_build_local "torch-$torch_version+cpu-*.whl"
set_args=()
if ((BUILD_LOCAL_HAS_WHEELS)); then
    # PyTorch's CPU index is not reachable from machines that reach only PyPI; the local
    # wheel is the same CPU build.
    set_args=(--set CPU_TORCH_INDEX_URL=)
fi

start=$SECONDS
log="$BYOC_SETUP_LOGS/image-build-${tag//[^A-Za-z0-9_.-]/_}.log"
if [ -n "$target" ]; then
    say_stage "the image's stages up to $target as $tag (log: $log)"
    bash docker/build.sh --flavor cpu --tag "$tag" "${set_args[@]}" --log "$log" \
        -- --network host --target "$target" "${extra[@]}" >&2
else
    say_stage "the image $tag: seconds from Docker's layer cache; a first build takes minutes, most of them Horovod's compile unless docker/wheelhouse/cpu keeps its wheel (log: $log)"
    bash docker/build.sh --flavor cpu --tag "$tag" "${set_args[@]}" --wheelhouse docker/wheelhouse/cpu --log "$log" \
        -- --network host "${extra[@]}" >&2
fi
size=$(docker image inspect --format '{{.Size}}' "$tag")
echo "build-local-image: $tag built in $((SECONDS - start)) s, $((size / 1000000)) MB" >&2
echo "$tag"

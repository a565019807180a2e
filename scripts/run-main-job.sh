#!/usr/bin/env bash
# The main job: sets up what is missing, then trains the default model (an MLP on scikit-learn's
# 8x8 digits) the way users run the image: builds (or reuses) the CPU image from this tree and
# runs the SageMaker Python SDK v2 PyTorch estimator in local mode on 2 instances
# (image_uri=<image>, instance_type="local"), streaming every host's log; ends with the
# validation accuracy and the path of model.tar.gz. Root needed (Docker engine).
#   --backend ddp (torchrun + DDP, default) | horovod (mpirun + Horovod) | mpi4py | ps
#   --hosts N  --processes-per-host P  --work DIR  --image-tag TAG (default $BYOC_IMAGE_TAG or byoc-training:cpu-local)
#   --sdk v3: SDK v3's ModelTrainer (Torchrun() for ddp, MPI() for horovod/mpi4py) instead of SDK v2's estimator
#   --emulated: 2 emulated hosts (Linux namespaces, no Docker) through `python -m entrypoint train`
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
# One clock for the set-up and the image build's progress lines (scripts/lib/stages.sh).
export BYOC_SETUP_T0=${BYOC_SETUP_T0:-$(date +%s)}
# Only what the main job needs: no test tools, no SDK v3. Horovod's wheel for the image: its
# compile is most of a first image build, and done here, beside the image's first stages, it
# costs less (the image's Horovod step installs the wheel: the same facts). The emulated
# hosts run the trainers with .venv's Python, so there it goes into .venv too.
bootstrap_args=(--for main-job --horovod-wheel)
emulated=0 tag=${BYOC_IMAGE_TAG:-byoc-training:cpu-local} previous=
sdk=v2
for arg in "$@"; do
    if [ "$arg" = --emulated ]; then bootstrap_args=(--for main-job --with-horovod) emulated=1; fi
    if [ "$previous" = --image-tag ]; then tag=$arg; fi
    if [ "$previous" = --sdk ]; then sdk=$arg; fi
    previous=$arg
done
bootstrap_args+=(--sdk "$sdk")
# The image's stages before Horovod (up to `runtime`: the venv and sshd, docker/Dockerfile.cpu)
# need only the Debian packages (Docker): they build in the background from then on, beside
# the venvs' installs and Horovod's compile (those mostly download and compile, these mostly
# unpack and write layers), with their own progress lines on the same clock. Then the whole
# image, whose Horovod step finds the wheel just made and adds a few MB; run_main_job takes it
# as built (--image-built).
build_pid=
if ((!emulated)); then
    bash scripts/bootstrap.sh --for main-job --apt-only
    bash scripts/build-local-image.sh --tag "$tag-runtime" --target runtime >/dev/null &
    build_pid=$!
    trap 'kill "$build_pid" 2>/dev/null || :' EXIT  # a failed set-up leaves no build running
fi
bash scripts/bootstrap.sh "${bootstrap_args[@]}"
if [ -n "$build_pid" ]; then
    if ! wait "$build_pid"; then
        echo "run-main-job: building the image's stages before Horovod failed (its log: .work/setup-logs/)" >&2
        exit 1
    fi
    trap - EXIT
    bash scripts/build-local-image.sh --tag "$tag" >/dev/null
    # Only the image keeps a tag; the runtime stage's layers are the image's own.
    eval "$(bash scripts/docker-engine.sh start 2>/dev/null)"
    docker rmi "$tag-runtime" >/dev/null
    set -- "$@" --image-built
fi
exec .venv/bin/python -m jobs.run_main_job "$@"

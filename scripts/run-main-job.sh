#!/usr/bin/env bash
# The main job: sets up what is missing, then trains the default model (an MLP on scikit-learn's
# 8x8 digits) the way users run the image: builds (or reuses) the CPU image from this tree and
# runs the SageMaker Python SDK v2 PyTorch estimator in local mode on 2 instances
# (image_uri=<image>, instance_type="local"), streaming every host's log; ends with the
# validation accuracy and the path of model.tar.gz. Root needed (Docker engine).
#   --backend ddp (torchrun + DDP, default) | horovod (mpirun + Horovod) | mpi4py | ps
#   --hosts N  --processes-per-host P  --work DIR  --image-tag TAG (default $BYOC_IMAGE_TAG or byoc-training:cpu-local)
#   --emulated: 2 emulated hosts (Linux namespaces, no Docker) through `python -m entrypoint train`
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
# One clock for the set-up and the image build's progress lines (scripts/lib/stages.sh).
export BYOC_SETUP_T0=${BYOC_SETUP_T0:-$(date +%s)}
# Only what the main job needs: no test tools, no SDK v3; Horovod in .venv only for the
# emulated hosts, which run the trainers with .venv's Python (the image has its own).
bootstrap_args=(--for main-job)
emulated=0 tag=${BYOC_IMAGE_TAG:-byoc-training:cpu-local} previous=
for arg in "$@"; do
    if [ "$arg" = --emulated ]; then bootstrap_args+=(--with-horovod) emulated=1; fi
    if [ "$previous" = --image-tag ]; then tag=$arg; fi
    previous=$arg
done
# The image build needs only the Debian packages (Docker): it runs in the background from then
# on, beside the venvs' installs (they mostly download, it mostly compiles), and prints its
# own progress lines on the same clock; run_main_job then takes it as built (--image-built).
build_pid=
if ((!emulated)); then
    bash scripts/bootstrap.sh --for main-job --apt-only
    bash scripts/build-local-image.sh --tag "$tag" >/dev/null &
    build_pid=$!
    trap 'kill "$build_pid" 2>/dev/null || :' EXIT  # a failed set-up leaves no build running
fi
bash scripts/bootstrap.sh "${bootstrap_args[@]}"
if [ -n "$build_pid" ] && ! wait "$build_pid"; then
    echo "run-main-job: building the image $tag failed (its log: .work/setup-logs/)" >&2
    exit 1
fi
trap - EXIT
if [ -n "$build_pid" ]; then
    set -- "$@" --image-built
fi
exec .venv/bin/python -m jobs.run_main_job "$@"

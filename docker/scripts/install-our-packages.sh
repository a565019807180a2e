#!/usr/bin/env bash
# This repository's packages (entrypoint, train, localcluster) from its pyproject.toml,
# with --no-deps: every dependency is already installed at the versions pinned in
# docker/versions.env, and `pip check` proves the set is consistent.
# usage: install-our-packages.sh SRC_DIR [--allow-torch-mismatch]
#   --allow-torch-mismatch: trn1 runs the torch that torch-neuronx needs, not the one
#   pyproject.toml pins for the other flavours; only that line of `pip check` is tolerated.
set -euo pipefail
src=${1:?usage: install-our-packages.sh SRC_DIR [--allow-torch-mismatch]}
allow_torch=${2:-}

python3 -m pip install --no-cache-dir -q --no-deps --no-build-isolation "$src"

# The check: dependencies consistent, and the launcher module loads.
if ! report=$(python3 -m pip check 2>&1); then
    if [ "$allow_torch" = "--allow-torch-mismatch" ]; then
        unexpected=$(grep -v '^sagemaker-byoc-training .* requires torch==' <<<"$report" || true)
    else
        unexpected=$report
    fi
    if [ -n "$unexpected" ]; then
        echo "$report" >&2
        exit 1
    fi
fi
python3 -c 'import entrypoint, train; print("install-our-packages: entrypoint and train import")'

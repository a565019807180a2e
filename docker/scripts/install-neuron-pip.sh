#!/usr/bin/env bash
# The Neuron Python packages for trn1, from Neuron's pip index and PyPI, each pinned:
# torch-neuronx with the torch it was built for, neuronx-cc, neuronx_distributed.
set -euo pipefail
: "${NEURON_PIP_INDEX_URL:?from docker/versions.env}"
: "${TORCH_NEURONX_VERSION:?from docker/versions.env}"
: "${TORCH_VERSION:?from docker/versions.env}"
: "${NEURONX_CC_VERSION:?from docker/versions.env}"
: "${NEURONX_DISTRIBUTED_VERSION:?from docker/versions.env}"

index_args=(--extra-index-url "$NEURON_PIP_INDEX_URL")
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    index_args+=(--extra-index-url "$TORCH_INDEX_URL")
fi
python3 -m pip install --no-cache-dir -q "${index_args[@]}" \
    "torch==$TORCH_VERSION" \
    "torch-neuronx==$TORCH_NEURONX_VERSION" \
    "neuronx-cc==$NEURONX_CC_VERSION" \
    "neuronx_distributed==$NEURONX_DISTRIBUTED_VERSION"

# The check: the versions asked for import, the compiler runs, torchrun is on PATH.
python3 - <<'PY'
import os
import torch
import torch_neuronx  # noqa: F401  (loads libnrt from the apt packages)
got = torch.__version__.split("+")[0]
assert got == os.environ["TORCH_VERSION"], f"torch {torch.__version__}"
print("install-neuron-pip: torch", torch.__version__, "and torch-neuronx import")
PY
neuronx-cc --version
command -v torchrun

#!/usr/bin/env bash
# PyTorch at exactly TORCH_VERSION, from TORCH_INDEX_URL (PyTorch's CPU or CUDA index)
# tried before PyPI; empty TORCH_INDEX_URL means PyPI and PIP_FIND_LINKS only (a local
# wheel folder mounted into the build).
# numpy at PYPI_NUMPY_VERSION comes in the same step (torch imports it when present).
# With CHECK_TORCH_CUDA=1 (GPU), checks torch's CUDA and NCCL against torch's own metadata
# and the base image (check-torch-cuda.py, beside this script): no NCCL number is kept by hand.
set -euo pipefail
: "${TORCH_VERSION:?from docker/versions.env}"

index_args=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    index_args=(--index-url "$TORCH_INDEX_URL" --extra-index-url https://pypi.org/simple)
fi
: "${PYPI_NUMPY_VERSION:?from docker/versions.env}"
python3 -m pip install --no-cache-dir -q "${index_args[@]}" \
    "torch==$TORCH_VERSION" "numpy==$PYPI_NUMPY_VERSION"

# The check: the version asked for, torchrun on PATH, and on GPU CUDA and NCCL.
python3 - <<'PY'
import os
import torch
want = os.environ["TORCH_VERSION"]
got = torch.__version__.split("+")[0]
assert got == want, f"torch {torch.__version__} installed, wanted {want}"
print(f"install-torch: torch {torch.__version__}")
PY
if [ "${CHECK_TORCH_CUDA:-}" = 1 ]; then
    python3 "$(dirname "${BASH_SOURCE[0]}")/check-torch-cuda.py"
fi
command -v torchrun

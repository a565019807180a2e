#!/usr/bin/env bash
# The last step of the builder stage: takes out of /opt/venv what a training job never
# runs, before the sagemaker stage copies it (about 0.3 GB on the CPU image):
#  - debug information in the extension modules compiled here (Horovod, mpi4py,
#    sagemaker-training's gethostname): pip builds them with -g;
#  - test suites shipped inside wheels (torch/test holds C++ test binaries; numpy, scipy,
#    sympy, ... ship their own tests/ folders), with their bytecode.
# Bytecode of everything else stays: with PYTHONDONTWRITEBYTECODE=1 at run time, every
# rank would otherwise recompile torch's sources at each start.
set -euo pipefail
venv=${VENV:-/opt/venv}
site=$("$venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
before=$(du -sm "$venv" | cut -f1)

for package in horovod mpi4py sagemaker_training; do
    if [ -d "$site/$package" ]; then
        find "$site/$package" -name '*.so' -type f -exec strip --strip-debug {} +
    fi
done
rm -rf "$site/torch/test"
find "$site" -mindepth 2 -type d -name tests -prune -exec rm -rf {} +

after=$(du -sm "$venv" | cut -f1)
echo "slim-venv: $venv ${before} MB -> ${after} MB"

# The check: what the image runs still imports.
python3 -c 'import torch, numpy, scipy.stats, sklearn.linear_model, sympy, sagemaker_training.environment, mpi4py'
if [ -d "$site/horovod" ]; then
    python3 -c 'import horovod.torch'
fi

#!/usr/bin/env bash
# The main job: sets up what is missing, then trains the default model (an MLP on
# scikit-learn's 8x8 digits) on 2 emulated SageMaker hosts through the image's entrypoint
# (`python -m entrypoint train` on every host), printing progress, and ends with the
# validation accuracy and the saved model's path. Root needed (hosts are Linux namespaces).
#   --backend ddp (torchrun + DDP, default) | horovod (mpirun + Horovod) | mpi4py | ps
#   --hosts N  --processes-per-host P
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/bootstrap.sh
exec .venv/bin/python -m train.run_main_job "$@"

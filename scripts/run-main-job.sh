#!/usr/bin/env bash
# The main job: sets up what is missing, writes a SageMaker /opt/ml tree under .work/main-job
# and runs the training program through the image's entrypoint (`python -m entrypoint train`),
# exactly as SageMaker would start the container on one host.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/bootstrap.sh
root="$repo_root/.work/main-job/opt/ml"
rm -rf "$root"
mkdir -p "$root/input/config" "$root/code" "$root/model" "$root/output"
cp examples/sample_train.py "$root/code/train.py"
printf '%s' '{"current_host": "algo-1", "hosts": ["algo-1"]}' > "$root/input/config/resourceconfig.json"
printf '%s' '{"sagemaker_program": "\"train.py\"", "epochs": "50", "lr": "0.1"}' > "$root/input/config/hyperparameters.json"
printf '%s' '{}' > "$root/input/config/inputdataconfig.json"
SAGEMAKER_BASE_DIR="$root" .venv/bin/python -m entrypoint train "$@"
echo "model: $(ls "$root"/model/*)"

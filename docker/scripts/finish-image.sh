#!/usr/bin/env bash
# The last step of every flavour's `sagemaker` stage: the /opt/ml folders SageMaker
# mounts into or expects, then a check that what SageMaker (and SDK v3's `bash -c`
# drivers, which bypass the ENTRYPOINT) run is where they look for it.
set -euo pipefail

install -d -m 755 /opt/ml/code /opt/ml/model /opt/ml/checkpoints \
    /opt/ml/input/config /opt/ml/input/data /opt/ml/output/data /opt/ml/output/intermediate

fail() { echo "finish-image: $*" >&2; exit 1; }

# `train` on PATH is ours, ahead of the one sagemaker-training installs in the venv.
[ "$(command -v train)" = /usr/local/byoc/bin/train ] || fail "train resolves to $(command -v train)"
for tool in python3 pip torchrun mpirun bash; do
    command -v "$tool" >/dev/null || fail "$tool is not on PATH"
done
[ "$(command -v python3)" = /opt/venv/bin/python3 ] || fail "python3 resolves to $(command -v python3)"
[ -x /usr/sbin/sshd ] || fail "/usr/sbin/sshd is missing"
python3 -m pip --version >/dev/null
python3 -c 'import entrypoint, torch, mpi4py, sagemaker_training, paramiko' || fail "an import failed"

# No private key in the image: every copy would share it.
if compgen -G '/etc/ssh/ssh_host_*' >/dev/null || compgen -G '/root/.ssh/id_*' >/dev/null; then
    fail "an SSH key is baked into the image"
fi
echo "finish-image: ok"

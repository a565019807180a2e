#!/usr/bin/env bash
# The SageMaker training toolkit (the environment contract our launcher is checked
# against) and paramiko (SageMaker SDK v3's MPI driver imports it). numpy and
# scikit-learn are pinned here too; numpy only where versions.env pins it (on trn1 it is
# the one torch-neuronx's own pins chose).
# Its C extension (gethostname) builds here, in the builder stage.
set -euo pipefail
: "${PYPI_SAGEMAKER_TRAINING_VERSION:?from docker/versions.env}"
: "${PYPI_PARAMIKO_VERSION:?from docker/versions.env}"
: "${PYPI_SCIKIT_LEARN_VERSION:?from docker/versions.env}"

python3 -m pip install --no-cache-dir -q \
    "sagemaker-training==$PYPI_SAGEMAKER_TRAINING_VERSION" \
    "paramiko==$PYPI_PARAMIKO_VERSION" \
    ${PYPI_NUMPY_VERSION:+"numpy==$PYPI_NUMPY_VERSION"} \
    "scikit-learn==$PYPI_SCIKIT_LEARN_VERSION"

# The check.
python3 -c 'import sagemaker_training.environment, paramiko, numpy, sklearn; print("install-sagemaker-training: imports")'

#!/usr/bin/env bash
# tensorboardX: the event writer of the job's live TensorBoard scalars (entrypoint/jobreport/
# live/tb_events.py). Lighter than the tensorboard package (no server, no grpcio): its wheel is
# ~90 kB, and protobuf, numpy and packaging, its only requirements, are already in every venv
# (sagemaker-training requires protobuf). Pinned in docker/versions.env.
set -euo pipefail
: "${PYPI_TENSORBOARDX_VERSION:?from docker/versions.env}"

python3 -m pip install --no-cache-dir -q "tensorboardX==$PYPI_TENSORBOARDX_VERSION"

# The check: the writer and its event protos load.
python3 -c 'from tensorboardX.event_file_writer import EventsWriter; from tensorboardX.proto.event_pb2 import Event; print("install-tensorboard-writer: imports")'

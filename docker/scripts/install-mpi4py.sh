#!/usr/bin/env bash
# mpi4py compiled against the image's own Open MPI (the mpicc on PATH: Debian's, or
# EFA's /opt/amazon/openmpi), so ranks never load a second MPI.
set -euo pipefail
: "${PYPI_MPI4PY_VERSION:?from docker/versions.env}"

MPICC=$(command -v mpicc) python3 -m pip install --no-cache-dir -q \
    --no-binary mpi4py "mpi4py==$PYPI_MPI4PY_VERSION"

# The check: the MPI library mpi4py loads is the image's Open MPI, and two ranks talk.
python3 - <<'PY'
import mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
version = MPI.Get_library_version()
assert "Open MPI" in version, version
print("install-mpi4py:", version.splitlines()[0])
PY
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe -np 2 -mca btl self,vader python3 -m mpi4py.bench helloworld

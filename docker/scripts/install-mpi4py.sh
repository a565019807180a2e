#!/usr/bin/env bash
# mpi4py against the image's own Open MPI (Debian's, or EFA's /opt/amazon/openmpi), so ranks
# never load a second MPI. MPI4PY_FROM:
#   source (the default; the GPU and Trainium images): compiled with the mpicc on PATH;
#   wheel (the CPU image): PyPI's binary wheel, which loads the libmpi the system's loader finds
#     at run time (mpi4py >= 4 wheels are built MPI-ABI-agnostic); it saves the ~3 min compile
#     on 2 cores, and the check below holds it to the image's Open MPI all the same.
set -euo pipefail
: "${PYPI_MPI4PY_VERSION:?from docker/versions.env}"

if [ "${MPI4PY_FROM:-source}" = wheel ]; then
    python3 -m pip install --no-cache-dir -q --only-binary mpi4py "mpi4py==$PYPI_MPI4PY_VERSION"
elif [ "${MPI4PY_FROM:-source}" = source ]; then
    MPICC=$(command -v mpicc) python3 -m pip install --no-cache-dir -q \
        --no-binary mpi4py "mpi4py==$PYPI_MPI4PY_VERSION"
else
    echo "install-mpi4py: MPI4PY_FROM=${MPI4PY_FROM} is neither wheel nor source" >&2
    exit 1
fi

# The check: the MPI library mpi4py loads is the image's Open MPI (the version mpirun reports),
# and two ranks talk.
MPIRUN_VERSION=$(mpirun --version | sed -n 's/.*(Open MPI) \([0-9.]*\).*/\1/p' | head -1) python3 - <<'PY'
import os
import mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
version = MPI.Get_library_version()
expected = os.environ["MPIRUN_VERSION"]
assert "Open MPI" in version and f"v{expected}" in version, (version, expected)
print("install-mpi4py:", version.splitlines()[0])
PY
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe -np 2 -mca btl self,vader python3 -m mpi4py.bench helloworld

"""Training scripts for the image: DDP (train.ddp_train), Horovod (train.horovod_train),
mpi4py (train.mpi_train) and a torch.distributed.rpc parameter server (train.ps_train,
train.ps_server), sharing one loop (train.loop). See docs/training.md."""

import os as _os

# Read once, when torch loads GNU OpenMP, so here, before any of the scripts imports torch:
# OpenMP threads waiting for work sleep instead of spinning (by default libgomp spins ~300,000
# times first when it thinks it has the cores to itself). Where ranks share cores without
# knowing it (SageMaker local mode: every host a container on one machine), a spinning rank
# took the core another rank's OpenMP region waited for: the main job's mpi4py trainer ran at
# ~130 samples/s with 2 threads a rank, ~4,000-7,500 with this and Open MPI's yield
# (train/devices.py: decide_mpi_wait_env; docs/training.md). A value the job sets wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

"""Which process am I? Rank, local rank and world size from any launcher's environment.

Pure: `parse_rank_info` reads a mapping (pass `os.environ`), so every launcher's shape is
tested by value. Priority (first match wins), most specific first:
  1. our parameter-server launch (BYOC_PS_ROLE): the training rank is the worker rank;
  2. torchrun / torch.distributed.run (RANK, WORLD_SIZE, LOCAL_RANK);
  3. Horovod's own launcher with Gloo (HOROVOD_RANK, HOROVOD_SIZE, ...);
  4. Open MPI's mpirun (OMPI_COMM_WORLD_*);
  5. MPICH / Intel MPI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS);
  6. nothing: one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    launcher: str  # "ps", "torchrun", "horovod", "openmpi", "pmi", "single"
    local_rank_known: bool = True  # False: the launcher set no local-rank variable (0 assumed)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


# (launcher, rank, world size, local rank, local world size): names of the variables.
_LAUNCHER_VARIABLES = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("horovod", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"environment variable {name} is required here but not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _checked(info: RankInfo) -> RankInfo:
    if info.world_size < 1:
        raise ValueError(f"world size must be >= 1, got {info.world_size} (launcher {info.launcher})")
    if not 0 <= info.rank < info.world_size:
        raise ValueError(f"rank {info.rank} is outside world size {info.world_size} (launcher {info.launcher})")
    if not 0 <= info.local_rank < info.local_world_size:
        raise ValueError(
            f"local rank {info.local_rank} is outside local world size {info.local_world_size}"
            f" (launcher {info.launcher})"
        )
    return info


def parse_rank_info(environ: Mapping[str, str]) -> RankInfo:
    """The training rank of this process, from the launcher's variables."""
    role = environ.get("BYOC_PS_ROLE")
    if role:
        if role != "worker":
            raise ValueError(f"BYOC_PS_ROLE={role!r}: only a parameter-server worker has a training rank")
        workers = _int(environ, "BYOC_NUM_WORKERS")
        servers = [s for s in environ.get("BYOC_PS_SERVERS", "").split(",") if s]
        per_host = max(1, workers // max(1, len(servers)))
        local = _int(environ, "LOCAL_RANK", 0)
        return _checked(RankInfo(_int(environ, "BYOC_WORKER_RANK"), local, workers,
                                 max(per_host, local + 1), "ps", environ.get("LOCAL_RANK", "") != ""))
    for launcher, rank, size, local_rank, local_size in _LAUNCHER_VARIABLES:
        if environ.get(rank, "") != "" and environ.get(size, "") != "":
            world = _int(environ, size)
            local = _int(environ, local_rank, 0)
            # Without a local size, assume every rank is on this host only when there is one.
            local_world = _int(environ, local_size, world if local_rank not in environ else local + 1)
            return _checked(RankInfo(_int(environ, rank), local, world, local_world, launcher,
                                     environ.get(local_rank, "") != ""))
    return RankInfo(0, 0, 1, 1, "single")

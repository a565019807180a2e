"""Which device a rank uses, and what numerics that device supports.

probe_* ask the machine; decide_* are pure. torch_xla (Trainium) is imported only when
present, so the scripts import cleanly on CPU and GPU images.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Mapping

import torch

from train.config import CPU_BINDINGS
from train.ranks import RankInfo


@dataclass(frozen=True)
class Precision:
    autocast_dtype: torch.dtype | None  # None: plain fp32
    grad_scaler: bool  # fp16 needs loss scaling; bf16 does not


def probe_device_type(environ: Mapping[str, str]) -> str:
    """'cuda', 'xla' (Trainium / Neuron) or 'cpu'."""
    if torch.cuda.is_available():
        return "cuda"
    on_neuron = environ.get("PJRT_DEVICE") == "NEURON" or environ.get("NEURON_RT_VISIBLE_CORES") is not None
    if on_neuron and importlib.util.find_spec("torch_xla") is not None:
        return "xla"
    return "cpu"


def probe_device(device_type: str, local_rank: int) -> torch.device:
    if device_type == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    if device_type == "xla":
        import torch_xla.core.xla_model as xm  # only on Neuron images

        return xm.xla_device()
    return torch.device("cpu")


def probe_bf16_supported(device_type: str) -> bool:
    return device_type == "cuda" and torch.cuda.is_bf16_supported()


def decide_precision(requested: str, device_type: str, bf16_supported: bool) -> Precision:
    if requested == "auto":
        if device_type == "cuda":
            requested = "bf16" if bf16_supported else "fp16"
        elif device_type == "xla":
            requested = "bf16"
        else:
            requested = "fp32"  # CPU autocast is slower than fp32 for small models
    if requested == "fp32":
        return Precision(None, False)
    if requested == "fp16" and device_type not in ("cuda",):
        raise ValueError(f"--precision fp16 needs a GPU (device here: {device_type}); use bf16 or fp32")
    if requested == "bf16":
        return Precision(torch.bfloat16, False)
    return Precision(torch.float16, True)


MPI_YIELD = "OMPI_MCA_mpi_yield_when_idle"


def decide_mpi_wait_env(environ: Mapping[str, str], device_type: str) -> dict[str, str]:
    """Settings for Open MPI, read when MPI starts: a CPU rank's blocking MPI calls (Waitall,
    Allreduce, Horovod's background negotiation) yield the core between polls instead of
    spinning on it. Spinning, a waiting rank takes a core from the rank it waits for whenever
    ranks share cores (more ranks than cores, or local mode's containers on one machine).
    On GPUs MPI only coordinates, and low latency matters more. A value the job sets wins."""
    if device_type != "cpu" or MPI_YIELD in environ:
        return {}
    return {MPI_YIELD: "1"}


def decide_cpu_threads(environ: Mapping[str, str], cpu_count: int, local_world_size: int) -> int:
    """An explicit OMP_NUM_THREADS wins; otherwise share the cores between this host's ranks."""
    explicit = environ.get("OMP_NUM_THREADS", "")
    if explicit.isdigit() and int(explicit) > 0:
        return int(explicit)
    return max(1, cpu_count // max(1, local_world_size))


@dataclass(frozen=True)
class CpuPlan:
    threads: int  # torch's intra-op threads for this rank
    cores: tuple[int, ...] | None  # the cores this rank keeps to itself; None: affinity left as it was

    def describe(self) -> str:
        cores = "unbound" if self.cores is None else ",".join(map(str, self.cores))
        return f"cpu_threads={self.threads} cpu_cores={cores}"


@dataclass(frozen=True)
class CpuFacts:
    allowed_cores: tuple[int, ...]  # this process's affinity (cgroup cpuset, taskset, a launcher's binding)
    launcher_cores: tuple[int, ...] | None  # the affinity of the process that started it; None: unknown


def decide_cpu_plan(environ: Mapping[str, str], facts: CpuFacts, local_rank: int | None,
                    local_world_size: int, binding: str) -> CpuPlan:
    """How many threads a CPU rank runs, and which cores it keeps to itself.

    `auto` splits the cores the process may use evenly between the host's ranks, in order
    (local rank 0 the first slice, ...), when each slice holds the rank's threads. Unbound, a
    rank's helper threads (gloo's I/O, Horovod's background loop) and the other ranks' compute
    are scheduled onto the same cores and each hand-off waits for a scheduler slice. Left as
    they are: a rank alone on its host; a rank whose launcher did not say its local rank
    (`local_rank` None: every rank would take the first slice); a rank that already has fewer
    cores than its launcher (mpirun --bind-to core/socket: the launcher placed it).
    """
    if binding not in CPU_BINDINGS:
        raise ValueError(f"--cpu_binding {binding!r}: expected one of {', '.join(CPU_BINDINGS)}")
    allowed = sorted(facts.allowed_cores)
    threads = decide_cpu_threads(environ, len(allowed), local_world_size)
    unbound = CpuPlan(threads, None)
    if binding == "none" or local_world_size < 2 or local_rank is None or not 0 <= local_rank < local_world_size:
        return unbound
    if facts.launcher_cores is not None and sorted(facts.launcher_cores) != allowed:
        return unbound
    per_rank = len(allowed) // local_world_size
    if per_rank < threads:
        return unbound  # oversubscribed: binding would only pile ranks together
    return CpuPlan(threads, tuple(allowed[local_rank * per_rank:(local_rank + 1) * per_rank]))


def probe_cpu_facts() -> CpuFacts:
    try:
        launcher = tuple(sorted(os.sched_getaffinity(os.getppid())))
    except OSError:
        launcher = None  # the parent already exited, or is not ours to look at
    return CpuFacts(tuple(sorted(os.sched_getaffinity(0))), launcher)


def apply_cpu_plan(plan: CpuPlan) -> None:
    if plan.cores is not None:
        # Every thread that exists now (the launcher's libraries may have started some);
        # threads started later inherit it. (One started by a thread not yet moved while
        # this loop runs would keep the old affinity: none of ours start threads here.)
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), plan.cores)
            except (ProcessLookupError, PermissionError):
                pass  # a thread that just ended, or one we may not move
    torch.set_num_threads(plan.threads)


def setup_cpu(environ: Mapping[str, str], ranks: RankInfo, binding: str) -> CpuPlan:
    plan = decide_cpu_plan(environ, probe_cpu_facts(), ranks.local_rank if ranks.local_rank_known else None,
                           ranks.local_world_size, binding)
    apply_cpu_plan(plan)
    return plan

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


CPU_BINDINGS = ("auto", "none")


def decide_cpu_plan(environ: Mapping[str, str], allowed_cores: tuple[int, ...], local_rank: int,
                    local_world_size: int, binding: str) -> CpuPlan:
    """How many threads a CPU rank runs, and which cores it keeps to itself.

    `auto` gives each of a host's ranks its own slice of the cores the process may use, in
    order (local rank 0 the first `threads`, ...), when there are enough for every rank:
    otherwise a rank's helper threads (gloo's I/O, Horovod's background loop) and the other
    ranks' compute are scheduled onto the same cores and each hand-off waits for a scheduler
    slice. A rank alone on its host, or one a launcher already bound to fewer cores than the
    host's ranks need (mpirun --bind-to core), is left as it is.
    """
    if binding not in CPU_BINDINGS:
        raise ValueError(f"--cpu_binding {binding!r}: expected one of {', '.join(CPU_BINDINGS)}")
    threads = decide_cpu_threads(environ, len(allowed_cores), local_world_size)
    if binding == "none" or local_world_size < 2 or not 0 <= local_rank < local_world_size:
        return CpuPlan(threads, None)
    if len(allowed_cores) < threads * local_world_size:
        return CpuPlan(threads, None)  # oversubscribed: binding would only pile ranks together
    cores = sorted(allowed_cores)
    return CpuPlan(threads, tuple(cores[local_rank * threads:(local_rank + 1) * threads]))


def probe_allowed_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity: cgroups, taskset, a launcher's binding)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def apply_cpu_plan(plan: CpuPlan) -> None:
    if plan.cores is not None:
        # Every thread that exists now, then the ones created later inherit it.
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), plan.cores)
            except (ProcessLookupError, PermissionError):
                pass  # a thread that just ended, or one we may not move
    torch.set_num_threads(plan.threads)


def setup_cpu(environ: Mapping[str, str], local_rank: int, local_world_size: int, binding: str) -> CpuPlan:
    plan = decide_cpu_plan(environ, probe_allowed_cores(), local_rank, local_world_size, binding)
    apply_cpu_plan(plan)
    return plan

"""PyTorch DistributedDataParallel training: nccl on GPU, gloo on CPU, xla on Trainium.

Run it under any launcher:
    torchrun --nproc_per_node 2 -m train.ddp_train --epochs 5
    mpirun -np 2 python -m train.ddp_train          (rank 0 publishes its address over MPI)
    python -m train.ddp_train                       (one process)
Gradient compression (--grad_compression fp16|bf16) uses DDP's communication hooks.
"""

from __future__ import annotations

import datetime
import gc
import os
import socket
from typing import Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from train.backend import Backend
from train.config import TrainConfig
from train.devices import probe_device, probe_device_type, setup_cpu
from train.ranks import RankInfo, parse_rank_info
from train.script import end_without_teardown, run_script

_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
PROCESS_GROUP_BACKENDS = {"cuda": "nccl", "cpu": "gloo", "xla": "xla"}


def decide_rendezvous(environ: Mapping[str, str], ranks: RankInfo) -> str:
    """'local' (one rank), 'env' (torchrun or the entrypoint set MASTER_ADDR), 'mpi' (publish it over MPI).

    One rank never rendezvouses: the entrypoint sets MASTER_ADDR/MASTER_PORT for every job, as
    the DLC does, and on a multi-host job without a launcher each host's single rank would
    otherwise open a store on the leader's port and join the leader's."""
    if ranks.world_size == 1:
        return "local"
    if environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        return "env"
    if ranks.launcher in ("openmpi", "pmi"):
        return "mpi"
    raise RuntimeError(f"{ranks.world_size} ranks from {ranks.launcher} but no MASTER_ADDR/MASTER_PORT:"
                       " launch with torchrun or mpirun, or set both variables")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


DEFAULT_COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)


def parse_collective_timeout(environ: Mapping[str, str]) -> datetime.timedelta:
    """How long a collective (and the rendezvous) may wait for the other ranks before it fails
    with an error instead of hanging: BYOC_COLLECTIVE_TIMEOUT_S in seconds, else
    BYOC_COLLECTIVE_TIMEOUT_MIN in minutes (fractions allowed), else 30 minutes. Read by the
    settings table's rows (entrypoint/settings.py), the rule the entrypoint refused a bad value
    by before the launch; outside it, a bad value raises its JobDefinitionError, naming it."""
    from entrypoint.decide.settings import parse_collective_timeout_s

    seconds = parse_collective_timeout_s(environ)
    return DEFAULT_COLLECTIVE_TIMEOUT if seconds is None else datetime.timedelta(seconds=seconds)


def start_process_group(pg_backend: str, ranks: RankInfo, environ: Mapping[str, str]) -> None:
    timeout = parse_collective_timeout(environ)
    how = decide_rendezvous(environ, ranks)
    if pg_backend == "xla":
        import torch_xla.distributed.xla_backend  # noqa: F401  registers the "xla" process group

        dist.init_process_group("xla", init_method="xla://", timeout=timeout)
    elif how == "env":
        dist.init_process_group(pg_backend, init_method="env://", rank=ranks.rank,
                                world_size=ranks.world_size, timeout=timeout)
    elif how == "local":
        dist.init_process_group(pg_backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        all_local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size() == comm.Get_size()
        offer = None
        if ranks.rank == 0:
            try:
                offer = (decide_rendezvous_host(environ, socket.gethostname(), _resolves, all_local), _free_port())
            except RuntimeError as exc:
                offer = str(exc)
        address = comm.bcast(offer, root=0)
        if isinstance(address, str):  # every rank fails with rank 0's reason, none waits for a store
            raise RuntimeError(address)
        dist.init_process_group(pg_backend, init_method=f"tcp://{address[0]}:{address[1]}", rank=ranks.rank,
                                world_size=ranks.world_size, timeout=timeout)


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except OSError:
        return False


def decide_rendezvous_host(environ: Mapping[str, str], hostname: str, resolves, all_local: bool) -> str:
    """Where rank 0 opens the store under plain mpirun. The host name SageMaker gives resolves
    on every host (SM_CURRENT_HOST); gethostname() may not (a container's random name). An
    unresolvable name used to leave every rank retrying the store for the collective timeout
    (30 min): on one host the loopback serves, across hosts it is an error that says so."""
    host = environ.get("SM_CURRENT_HOST") or hostname
    if resolves(host):
        return host
    if all_local:
        return "127.0.0.1"
    raise RuntimeError(f"rank 0's host name {host!r} does not resolve and the ranks span several hosts: "
                       "set SM_CURRENT_HOST to a name every host resolves (the entrypoint does), "
                       "or MASTER_ADDR and MASTER_PORT")


class DDPBackend(Backend):
    name = "ddp"

    def __init__(self, config: TrainConfig, ranks: RankInfo, device: torch.device):
        super().__init__(ranks, device)
        self.config = config

    def reduce(self, values, op):
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=_OPS[op])
        return tensor.tolist()

    def broadcast_object(self, obj):
        holder = [obj]
        # nccl and xla move objects through device memory; gloo through the CPU.
        dist.broadcast_object_list(holder, src=0, device=self.device if self.device.type != "cpu" else None)
        return holder[0]

    def barrier(self):
        dist.barrier()

    def prepare(self, model: nn.Module, optimizer, start_step, checkpoint):
        if self.config.sync_batchnorm:
            if self.device.type != "cuda":
                raise ValueError("--sync_batchnorm needs GPUs (torch's SyncBatchNorm is CUDA-only)")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # DDP broadcasts rank 0's weights here; gradients travel in buckets of bucket_mb.
        ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=self.config.bucket_mb,
                                      gradient_as_bucket_view=True)
        if self.config.grad_compression == "bf16" and self.device.type != "cuda":
            raise ValueError("--grad_compression bf16 needs GPUs (DDP's bf16 hook needs NCCL); use fp16 on CPU")
        if self.config.grad_compression != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = {"fp16": default_hooks.fp16_compress_hook,
                    "bf16": default_hooks.bf16_compress_hook}[self.config.grad_compression]
            ddp.register_comm_hook(state=None, hook=hook)
        return ddp, optimizer, start_step

    def backward_step(self, loss, optimizer, scaler, lr):
        super().backward_step(loss, optimizer, scaler, lr)
        if self.device.type == "xla":
            import torch_xla.core.xla_model as xm

            xm.mark_step()  # XLA runs the graph traced so far

    def finish(self):
        if dist.is_initialized():
            # Collect the DDP wrapper (reference cycles keep it alive) before tearing down:
            # Gloo work objects that outlive the group abort the process at interpreter exit
            # ("terminate called without an active exception").
            gc.collect()
            dist.destroy_process_group()


GLOO_IO_THREAD = "gloo_tcp_loop"  # the name gloo's TCP transport gives its epoll thread


def find_threads(name: str) -> list[int]:
    """Thread ids of this process whose name is `name`."""
    found = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == name:
                    found.append(int(tid))
        except OSError:
            continue  # the thread ended
    return found


def yield_gloo_io_thread() -> int:
    """Run gloo's TCP I/O thread only when nothing else of this rank wants its cores.

    The I/O thread handles a socket only if it gets the connection's lock at once; when a
    process-group worker holds it (posting the next send), the thread returns to epoll, which
    reports the same unread data again: it spins until the worker runs. With a rank bound to
    its own core the spinning thread and that worker share the core, and the worker waits for
    the scheduler to preempt the spinner (up to a time slice, ~1-4 ms, per hand-off). As
    SCHED_IDLE, the I/O thread steps aside at once; it still runs whenever the rank waits for
    the network, which is when it has work. Measured on 2 cores, 2 ranks: a 340 KB allreduce
    1.0 -> 0.3 ms. Returns how many threads were changed (0 when gloo names its thread differently).
    """
    changed = 0
    for tid in find_threads(GLOO_IO_THREAD):
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            changed += 1
        except OSError:
            continue
    return changed


def build_ddp_backend(config: TrainConfig, environ: Mapping[str, str]) -> DDPBackend:
    ranks = parse_rank_info(environ)
    device_type = probe_device_type(environ)
    cpu_plan = setup_cpu(environ, ranks, config.cpu_binding) \
        if device_type == "cpu" else None
    device = probe_device(device_type, ranks.local_rank)
    start_process_group(PROCESS_GROUP_BACKENDS[device_type], ranks, environ)
    if cpu_plan is not None and cpu_plan.cores is not None and len(cpu_plan.cores) == 1:
        # Only for a rank bound to one core (so one thread), the case measured. Unbound, the
        # spinning thread takes a core from another rank instead, and SCHED_IDLE could leave
        # it waiting behind every busy process on the host; with more cores the rank has a
        # spare one for it, and with more threads it would wait behind OpenMP's workers,
        # which spin for a while after each parallel region. Process groups made later
        # (dist.new_group) get their own I/O thread, left as it is.
        yield_gloo_io_thread()
    backend = DDPBackend(config, ranks, device)
    backend.cpu_plan = cpu_plan
    return backend


def main(argv=None) -> None:
    run_script(build_ddp_backend, argv)


if __name__ == "__main__":
    main()
    end_without_teardown()  # only after a run that ended well: errors still raise through main()

"""Data parallelism with plain mpi4py (no torch.distributed): gradients are packed into
buckets and averaged with non-blocking MPI allreduces (Iallreduce) while backward is still
running; the optimizer step waits for them.

    mpirun -np 2 python -m train.mpi_train --epochs 5
    mpirun -np 2 python -m mpi4py -m train.mpi_train     (what SageMaker's MPI launch does)

How the overlap works: a hook per parameter (register_post_accumulate_grad_hook) copies the
gradient into its bucket as soon as autograd has it. When every gradient of a bucket is in,
the bucket's Iallreduce starts. Buckets are filled in reverse parameter order (the order
backward produces them) and always started in bucket order, so every rank issues the same
collectives in the same order, as MPI requires. Open MPI progresses non-blocking collectives
only inside MPI calls, so each hook also tests the requests in flight.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from train.report_hooks import timed_as
from train.backend import Backend
from train.config import TrainConfig
from train.devices import decide_mpi_wait_env, probe_device, probe_device_type, setup_cpu
from train.ranks import RankInfo
from train.script import run_script


@dataclass(frozen=True)
class BucketPlan:
    buckets: tuple[tuple[int, ...], ...]  # parameter indices per bucket, in launch order


def build_bucket_plan(numels: Sequence[int], bucket_bytes: int, element_bytes: int = 4) -> BucketPlan:
    """Group parameters (given in model order) into buckets of about `bucket_bytes`, walking
    backwards because backward produces the last layer's gradients first."""
    buckets, current, size = [], [], 0
    for index in reversed(range(len(numels))):
        current.append(index)
        size += numels[index] * element_bytes
        if size >= bucket_bytes:
            buckets.append(tuple(current))
            current, size = [], 0
    if current:
        buckets.append(tuple(current))
    return BucketPlan(tuple(buckets))


class BucketedAllreduce:
    """Averages the gradients of `params` over `comm`, overlapped with backward."""

    def __init__(self, comm, params: list[torch.nn.Parameter], bucket_bytes: int):
        from mpi4py import MPI

        self._MPI, self._comm, self._size = MPI, comm, comm.Get_size()
        self._params = params
        self.plan = build_bucket_plan([p.numel() for p in params], bucket_bytes)
        self._buffers = [torch.zeros(sum(params[i].numel() for i in bucket), dtype=torch.float32)
                         for bucket in self.plan.buckets]
        self._arrays = [b.numpy() for b in self._buffers]  # MPI writes into the tensors' memory
        self._where: dict[int, tuple[int, int]] = {}  # param index -> (bucket, offset)
        for b, bucket in enumerate(self.plan.buckets):
            offset = 0
            for i in bucket:
                self._where[i] = (b, offset)
                offset += params[i].numel()
        self._index = {id(p): i for i, p in enumerate(params)}
        self._reset()
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _reset(self) -> None:
        self._missing = [len(bucket) for bucket in self.plan.buckets]
        self._filled: set[int] = set()
        self._next_launch = 0
        self._requests: list = []

    def _copy_in(self, index: int, grad: torch.Tensor | None) -> None:
        b, offset = self._where[index]
        target = self._buffers[b][offset:offset + self._params[index].numel()]
        if grad is None:
            target.zero_()
        else:
            target.copy_(grad.detach().reshape(-1))
        self._filled.add(index)
        self._missing[b] -= 1

    def _on_grad_ready(self, param: torch.nn.Parameter) -> None:
        index = self._index[id(param)]
        if index in self._filled:
            raise RuntimeError("a gradient arrived twice in one step: call backward once per step")
        self._copy_in(index, param.grad)
        self._launch_ready()
        if self._requests:
            self._MPI.Request.Testall(self._requests)  # let Open MPI progress the reductions in flight

    def _launch_ready(self) -> None:
        while self._next_launch < len(self._missing) and self._missing[self._next_launch] == 0:
            self._requests.append(self._comm.Iallreduce(self._MPI.IN_PLACE, self._arrays[self._next_launch],
                                                        op=self._MPI.SUM))
            self._next_launch += 1

    def wait(self) -> None:
        """Finish every bucket and put the averaged gradients in `.grad`."""
        for i in range(len(self._params)):
            if i not in self._filled:  # unused in this step: contributes zeros, like DDP
                self._copy_in(i, None)
        self._launch_ready()
        self._MPI.Request.Waitall(self._requests)
        for buffer in self._buffers:
            buffer.div_(self._size)
        for i, p in enumerate(self._params):
            b, offset = self._where[i]
            averaged = self._buffers[b][offset:offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = averaged.to(p.device, copy=True)
            else:
                p.grad.copy_(averaged)
        self._reset()


class MPIBackend(Backend):
    name = "mpi4py"

    def __init__(self, config: TrainConfig, comm, ranks: RankInfo, device: torch.device):
        super().__init__(ranks, device)
        from mpi4py import MPI

        self.config, self.comm, self._MPI = config, comm, MPI
        self._ops = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}
        self.allreduce: BucketedAllreduce | None = None

    def reduce(self, values, op):
        data = np.asarray(values, dtype=np.float64)
        out = np.empty_like(data)
        self.comm.Allreduce(data, out, op=self._ops[op])
        return out.tolist()

    def broadcast_object(self, obj):
        return self.comm.bcast(obj, root=0)

    def barrier(self):
        self.comm.Barrier()

    def prepare(self, model, optimizer, start_step, checkpoint):
        for tensor in list(model.parameters()) + list(model.buffers()):
            host = tensor.detach().to("cpu", copy=True).contiguous()
            self.comm.Bcast(host.numpy(), root=0)  # rank 0's initial weights everywhere
            tensor.data.copy_(host)
        params = [p for p in model.parameters() if p.requires_grad]
        self.allreduce = BucketedAllreduce(self.comm, params, int(self.config.bucket_mb * 2**20))
        return model, optimizer, start_step

    def backward_step(self, loss, optimizer, scaler, lr):
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            with timed_as("wait"):
                self.allreduce.wait()
            scaler.step(optimizer)
            scaler.update()
            return
        loss.backward()
        with timed_as("wait"):
            self.allreduce.wait()
        optimizer.step()


def build_mpi_backend(config: TrainConfig, environ: Mapping[str, str]) -> MPIBackend:
    device_type = probe_device_type(environ)
    # Before MPI starts (importing mpi4py.MPI starts it; under `python -m mpi4py` it already has).
    os.environ.update(decide_mpi_wait_env(environ, device_type))
    from mpi4py import MPI

    if config.grad_compression != "none":
        raise ValueError("--grad_compression needs a 16-bit MPI sum, which MPI does not define; "
                         "use train.ddp_train or train.horovod_train")
    if config.sync_batchnorm:
        raise ValueError("--sync_batchnorm is available with train.ddp_train and train.horovod_train")
    comm = MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ranks = RankInfo(comm.Get_rank(), local.Get_rank(), comm.Get_size(), local.Get_size(), "mpi4py")
    local.Free()
    if device_type == "xla":
        raise RuntimeError("the mpi4py trainer does not run on Trainium; use train.ddp_train")
    cpu_plan = setup_cpu(environ, ranks, config.cpu_binding) \
        if device_type == "cpu" else None
    backend = MPIBackend(config, comm, ranks, probe_device(device_type, ranks.local_rank))
    backend.cpu_plan = cpu_plan
    return backend


def main(argv=None) -> None:
    run_script(build_mpi_backend, argv)


if __name__ == "__main__":
    main()

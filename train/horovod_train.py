"""Horovod training: hvd.DistributedOptimizer averages gradients (allreduce during backward);
rank 0's initial state reaches every rank with broadcast_parameters + broadcast_optimizer_state.

    mpirun -np 2 python -m train.horovod_train --epochs 5
    horovodrun -np 2 python -m train.horovod_train --epochs 5        (MPI or Gloo controller)
Gradient compression (--grad_compression fp16) uses hvd.Compression.fp16.
"""

from __future__ import annotations

import os
from typing import Mapping

import torch
from torch import nn

from train.backend import Backend
from train.config import TrainConfig
from train.devices import decide_mpi_wait_env, probe_device, probe_device_type, setup_cpu
from train.ranks import RankInfo
from train.script import run_script


def convert_sync_batchnorm(module: nn.Module, sync_cls) -> nn.Module:
    """Swap every BatchNorm for Horovod's SyncBatchNorm, keeping the same Parameter objects
    (so an optimizer built before the swap still updates them)."""
    for name, child in module.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            sync = sync_cls(child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats)
            if child.affine:
                sync.weight, sync.bias = child.weight, child.bias
            if child.track_running_stats:
                sync.running_mean, sync.running_var = child.running_mean, child.running_var
                sync.num_batches_tracked = child.num_batches_tracked
            setattr(module, name, sync)
        else:
            convert_sync_batchnorm(child, sync_cls)
    return module


class HorovodBackend(Backend):
    name = "horovod"

    def __init__(self, config: TrainConfig, hvd, ranks: RankInfo, device: torch.device):
        super().__init__(ranks, device)
        self.config, self.hvd = config, hvd
        self._ops = {"sum": hvd.Sum, "min": hvd.Min, "max": hvd.Max}

    def reduce(self, values, op):
        tensor = torch.tensor(values, dtype=torch.float64)
        return self.hvd.allreduce(tensor, op=self._ops[op], name=f"reduce.{op}.{len(values)}").tolist()

    def broadcast_object(self, obj):
        return self.hvd.broadcast_object(obj, root_rank=0, name="broadcast_object")

    def barrier(self):
        self.hvd.barrier()

    def prepare(self, model, optimizer, start_step, checkpoint):
        hvd = self.hvd
        if self.config.sync_batchnorm:
            if self.device.type != "cuda":
                raise ValueError("--sync_batchnorm needs GPUs (Horovod's SyncBatchNorm is CUDA-only)")
            model = convert_sync_batchnorm(model, hvd.SyncBatchNorm)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}.get(self.config.grad_compression)
        if compression is None:
            raise ValueError("--grad_compression bf16 is not available with Horovod; use fp16 or none")
        # The wrapper is a new optimizer over the same parameters with fresh state: carry over
        # what a checkpoint put in the plain one.
        distributed = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                               compression=compression, op=hvd.Average)
        distributed.load_state_dict(optimizer.state_dict())
        # Every rank agrees whether there is state (the checkpoint was broadcast first). With no
        # state yet, Horovod would initialise it by a zero-gradient step, which counts an Adam
        # step and applies weight decay once: then the ranks are identical anyway, skip it.
        if distributed.state_dict()["state"]:
            hvd.broadcast_optimizer_state(distributed, root_rank=0)
        return model, distributed, start_step

    def backward_step(self, loss, optimizer, scaler, lr):
        optimizer.zero_grad()  # Horovod's zero_grad takes no arguments
        if scaler is None:
            loss.backward()
            optimizer.step()
            return
        scaler.scale(loss).backward()
        optimizer.synchronize()  # allreduce before unscaling, then step without a second allreduce
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update()

    def finish(self):
        self.hvd.shutdown()


def build_horovod_backend(config: TrainConfig, environ: Mapping[str, str]) -> HorovodBackend:
    import horovod.torch as hvd

    device_type = probe_device_type(environ)
    if device_type == "xla":
        raise RuntimeError("Horovod does not run on Trainium; use train.ddp_train (xla process group)")
    # Horovod's background thread waits inside MPI calls (its negotiation every cycle), which
    # spin by default: on the core the rank computes on when bound, on another rank's core
    # when ranks share cores. Yielding gives the core back (docs/training.md).
    os.environ.update(decide_mpi_wait_env(environ, device_type))
    hvd.init()
    ranks = RankInfo(hvd.rank(), hvd.local_rank(), hvd.size(), hvd.local_size(), "horovod")
    # Decided again with Horovod's own local rank and size, which are authoritative; binds
    # every thread, Horovod's background thread included.
    cpu_plan = setup_cpu(environ, ranks, config.cpu_binding) if device_type == "cpu" else None
    backend = HorovodBackend(config, hvd, ranks, probe_device(device_type, ranks.local_rank))
    backend.cpu_plan = cpu_plan
    return backend


def main(argv=None) -> None:
    run_script(build_horovod_backend, argv)


if __name__ == "__main__":
    main()

"""What the training loop needs from a way of training in parallel (DDP, Horovod, mpi4py, a
parameter server). Each script implements this for its framework; the loop stays one.

The default methods are what a single process does; allreduce-style backends override
`reduce`, `broadcast_object`, `barrier`; `prepare` and `backward_step` are where they differ.
"""

from __future__ import annotations

import torch
from torch import nn

from train.channels import ShardPlan
from train.ranks import RankInfo


def to_cpu(value):
    """A copy of nested dicts/lists whose tensors are copies on the CPU (GPU and XLA tensors
    are not what a checkpoint file should hold). Always a copy, CPU tensors too: a checkpoint
    is written in the background while the next steps change the live tensors in place."""
    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


class Backend:
    name = "single"
    stop_request = None  # the loop's StopRequest, for backends that carry it themselves
    cpu_plan = None  # devices.CpuPlan on CPU: threads and cores, reported in the [setup] line

    def __init__(self, rank_info: RankInfo, device: torch.device):
        self.rank_info = rank_info
        self.device = device

    # -- agreement between ranks -------------------------------------------------
    def reduce(self, values: list[float], op: str) -> list[float]:
        """Element-wise sum / min / max over ranks (float64 on the wire)."""
        return list(values)

    def broadcast_object(self, obj):
        """The leader's `obj` on every rank."""
        return obj

    def barrier(self) -> None:
        pass

    def agree_stop(self, local_stop: bool) -> bool:
        """True on every rank when any rank was asked to stop (SIGTERM)."""
        return self.reduce([1.0 if local_stop else 0.0], "max")[0] > 0

    def eval_shard(self, shard: ShardPlan) -> ShardPlan:
        return shard

    # -- training ---------------------------------------------------------------
    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, start_step: int,
                checkpoint: dict | None) -> tuple[nn.Module, torch.optim.Optimizer, int]:
        """The module to call for training, the optimizer to step (and set the lr of, and
        checkpoint), and the step to start at."""
        return model, optimizer, start_step

    def backward_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                      scaler: torch.amp.GradScaler | None, lr: float) -> None:
        optimizer.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """{"model", "optimizer"} on the rank that writes checkpoints, None elsewhere: copies
        (to_cpu), taken now, that the next optimizer step does not change."""
        if not self.rank_info.is_leader:
            return None
        from train.models import unwrap

        return {"model": to_cpu(unwrap(model).state_dict()), "optimizer": to_cpu(optimizer.state_dict())}

    def finish(self) -> None:
        pass

    def abort(self) -> None:
        """After an error: release what would keep the process from exiting, without waiting
        for the other ranks."""

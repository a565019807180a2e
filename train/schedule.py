"""Learning rate for the large-minibatch recipe (Goyal et al. 2017, "Accurate, Large Minibatch
SGD"): the linear scaling rule (peak lr = lr x number of ranks, each rank keeping its batch)
and a gradual warmup from lr to the peak, linear in steps, over the first epochs."""

from __future__ import annotations


def build_peak_lr(lr: float, world_size: int, scale_lr: bool) -> float:
    return lr * world_size if scale_lr else lr


def build_warmup_steps(warmup_epochs: float, steps_per_epoch: int) -> int:
    return int(round(warmup_epochs * steps_per_epoch))


def build_lr(step: int, lr: float, peak_lr: float, warmup_steps: int) -> float:
    """lr used for optimizer step `step` (counting from 0)."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return peak_lr
    return lr + (peak_lr - lr) * step / warmup_steps

"""Checkpoints: one file, replaced atomically, so a kill at any instant leaves either the
previous checkpoint or the new one, never a torn file.

A checkpoint holds only tensors and plain values (loaded with weights_only=True):
{"step", "model", "optimizer", "extra"}. The data order and the per-step random seeds are
functions of (seed, epoch, step), so model + optimizer + step are enough for a resumed run to
end bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import os

import torch

CHECKPOINT_FILE = "checkpoint.pt"


def build_checkpoint_path(checkpoint_dir: str) -> str:
    return os.path.join(checkpoint_dir, CHECKPOINT_FILE)


def save_checkpoint(checkpoint_dir: str, state: dict) -> str:
    os.makedirs(checkpoint_dir, exist_ok=True)
    path = build_checkpoint_path(checkpoint_dir)
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    dir_fd = os.open(checkpoint_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    return path


def load_checkpoint(checkpoint_dir: str) -> dict | None:
    path = build_checkpoint_path(checkpoint_dir)
    if not os.path.exists(path):
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a checkpoint we cannot read must stop the job, not restart it from 0
        raise RuntimeError(f"cannot read checkpoint {path}: {err}") from err

"""Checkpoints: one file, replaced atomically, so a kill at any instant leaves either the
previous checkpoint or the new one, never a torn file.

A checkpoint holds only tensors and plain values (loaded with weights_only=True):
{"step", "model", "optimizer", "extra"}. The data order and the per-step random seeds are
functions of (seed, epoch, step), so model + optimizer + step are enough for a resumed run to
end bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import errno
import os
import shutil

import torch

CHECKPOINT_FILE = "checkpoint.pt"
# A failed write with less room than this left is a full disk (a write needs at least a page).
FULL_BELOW_BYTES = 64 * 1024


def build_checkpoint_path(checkpoint_dir: str) -> str:
    return os.path.join(checkpoint_dir, CHECKPOINT_FILE)


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the previous one (if any) is intact."""


def save_checkpoint(checkpoint_dir: str, state: dict) -> str:
    """Write to a partial file, then rename over the checkpoint. When the write fails (a full
    disk, an I/O error) the partial file is removed and the previous checkpoint stays as it
    was; the error says where and, for a full disk, how much room there was."""
    os.makedirs(checkpoint_dir, exist_ok=True)
    path = build_checkpoint_path(checkpoint_dir)
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException as err:
        # Described before the partial file goes: a full disk is still full now.
        message = build_write_error(checkpoint_dir, path, err) if isinstance(err, (OSError, RuntimeError)) else None
        _remove_quietly(partial)
        if message is None:
            raise
        raise CheckpointWriteError(message) from err
    dir_fd = os.open(checkpoint_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    remove_stale_partials(checkpoint_dir)
    return path


def remove_stale_partials(checkpoint_dir: str) -> None:
    """Partial files a killed writer left (SIGKILL mid-write): any whose process is gone."""
    prefix, suffix = CHECKPOINT_FILE + ".", ".partial"
    for name in os.listdir(checkpoint_dir):
        pid = name[len(prefix):-len(suffix)] if name.startswith(prefix) and name.endswith(suffix) else ""
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            _remove_quietly(os.path.join(checkpoint_dir, name))


def build_write_error(checkpoint_dir: str, path: str, err: BaseException) -> str:
    previous = f"the previous checkpoint {path} is intact" if os.path.exists(path) else "there was no previous checkpoint"
    try:
        free_bytes: int | None = shutil.disk_usage(checkpoint_dir).free
    except OSError:
        free_bytes = None
    # torch.save reports a failed write of its zip stream as a RuntimeError that names no
    # errno ("file write failed"), so the free space decides too.
    causes = [err, err.__cause__, err.__context__]
    full = any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in causes)
    full = full or "No space left on device" in str(err) or (free_bytes is not None and free_bytes < FULL_BELOW_BYTES)
    if full:
        free = f"{free_bytes:,} bytes free" if free_bytes is not None else "free space unknown"
        return (f"checkpoint not written: the disk holding {checkpoint_dir} is full ({free}); {previous}. "
                f"Free space there or use a larger volume (checkpoint_s3_uri / the instance's storage).")
    reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    return f"checkpoint not written to {checkpoint_dir}: {reason}; {previous}."


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def load_checkpoint(checkpoint_dir: str) -> dict | None:
    path = build_checkpoint_path(checkpoint_dir)
    if not os.path.exists(path):
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a checkpoint we cannot read must stop the job, not restart it from 0
        raise RuntimeError(f"cannot read checkpoint {path}: {err}") from err

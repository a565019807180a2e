"""Checkpoints: one file, replaced atomically, so a kill at any instant leaves either the
previous checkpoint or the new one, never a torn file.

A checkpoint holds only tensors and plain values (loaded with weights_only=True):
{"step", "model", "optimizer", "extra"}. The data order and the per-step random seeds are
functions of (seed, epoch, step), so model + optimizer + step are enough for a resumed run to
end bit-identical to an uninterrupted one.

CheckpointWriter writes them in a background thread: the training thread copies the step's
state (Backend.checkpoint_state) and goes on; serializing, fsync and the rename happen beside it.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from typing import Callable

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
    path = build_checkpoint_path(checkpoint_dir)
    partial = f"{path}.{os.getpid()}.partial"
    try:
        os.makedirs(checkpoint_dir, exist_ok=True)  # a folder that cannot be made is a write error too
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
    return f"checkpoint {path} not written: {reason}; {previous}."


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class CheckpointWriter:
    """One thread that writes checkpoints with save_checkpoint while the training goes on.

    `submit` takes a state whose tensors are the caller's own copies (Backend.checkpoint_state
    copies them at the step boundary, before the next optimizer step changes the live ones):
    the writer never reads the model. At most one save is in flight: `reserve` (before the copy
    is taken) and `submit` first wait for the previous one to be on disk, so a checkpoint
    interval shorter than one write slows the training to the disk's pace and never piles up
    copies in memory; `on_waited(step, s)` says when that happened.
    `on_saved(step, path, paused_s, write_s, write_cpu_s)` runs in the writer thread once the
    file is durably in place (written, fsynced, renamed, the folder fsynced): the "[checkpoint]
    saved" line comes from there and nowhere earlier. paused_s: how long the training thread
    spent on this checkpoint (a wait for the previous write, the copy, the hand-over); write_s,
    write_cpu_s: the write itself, in this thread, and the CPU time it used (what it can take
    from the training when every core is busy).

    A failed write (CheckpointWriteError: a full disk, an I/O error; or any other exception)
    is reported at once through `on_failed(step, err)` and raised, as it is, on the training
    thread by the next `submit`, `wait` or `raise_if_failed`: the job fails as a synchronous
    write would have made it fail, a moment later. `close` lets a write in flight finish (it
    does not raise: it runs on the way out, where an earlier error is the one to report).
    """

    def __init__(self, checkpoint_dir: str, on_saved: Callable[[int, str, float, float, float], None],
                 on_failed: Callable[[int, BaseException], None] = lambda step, err: None,
                 on_waited: Callable[[int, float], None] = lambda step, waited_s: None,
                 save: Callable[[str, dict], str] = save_checkpoint):
        self.checkpoint_dir = checkpoint_dir
        self._on_saved, self._on_failed, self._on_waited, self._save = on_saved, on_failed, on_waited, save
        # _job, _busy, _error, _closed: written by the training thread (submit, wait, close) and
        # by the writer thread (it takes _job, clears _busy, sets _error); always under _changed.
        self._changed = threading.Condition()
        self._job: tuple[int, dict, float] | None = None  # step, state, seconds the training paused for it
        self._busy = False  # a submitted save is not on disk yet (or not failed yet)
        self._error: BaseException | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def reserve(self, step: int) -> None:
        """Wait until no save is in flight (on_waited says so when that took a wait) and raise
        a failed save's error. Called before taking the copy for `step`, so that one copy
        exists at a time; `submit` calls it too."""
        started = time.perf_counter()
        with self._changed:
            busy = self._busy
        if busy:
            self.wait()
            self._on_waited(step, time.perf_counter() - started)
        self.raise_if_failed()

    def submit(self, step: int, state: dict, copy_started: float | None = None) -> None:
        """Hand `state` (the caller's copy, not to be changed afterwards) to the writer; first
        wait for the previous save and raise its error, if it failed (reserve). copy_started:
        when the caller began (time.perf_counter(), before its reserve), for on_saved's paused_s."""
        copy_started = time.perf_counter() if copy_started is None else copy_started
        self.reserve(step)
        with self._changed:
            if self._closed:
                raise RuntimeError("the checkpoint writer is closed")
            self._job, self._busy = (step, state, time.perf_counter() - copy_started), True
            self._changed.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
            self._thread.start()

    def wait(self) -> None:
        """Until no save is in flight; then raise a failed save's error."""
        with self._changed:
            self._changed.wait_for(lambda: not self._busy)
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        """Raise a failed save's error (once), on the caller's thread."""
        with self._changed:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Let a save in flight end (written or failed), then stop the thread."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._job is not None or self._closed)
                if self._job is None:
                    return
                (step, state, paused_s), self._job = self._job, None
            error = None
            try:
                started, cpu_started = time.perf_counter(), time.thread_time()
                path = self._save(self.checkpoint_dir, state)
                self._on_saved(step, path, paused_s, time.perf_counter() - started, time.thread_time() - cpu_started)
            except BaseException as err:  # kept for the training thread, which decides what it means
                error = err
                self._report_failure(step, err)
            state = None  # this copy is freed before the next one is made
            with self._changed:
                self._error = self._error or error
                self._busy = False
                self._changed.notify_all()

    def _report_failure(self, step: int, err: BaseException) -> None:
        try:
            self._on_failed(step, err)
        except Exception:  # the error itself still reaches the training thread
            pass


def load_checkpoint(checkpoint_dir: str) -> dict | None:
    path = build_checkpoint_path(checkpoint_dir)
    if not os.path.exists(path):
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a checkpoint we cannot read must stop the job, not restart it from 0
        raise RuntimeError(f"cannot read checkpoint {path}: {err}") from err

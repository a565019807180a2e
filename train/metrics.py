"""Metrics and progress, for people and for SageMaker.

Metric lines have one fixed format that SageMaker `metric_definitions` regexes parse
(the regexes are in docs/training.md):

    [metrics] epoch=<int> step=<int> <name>=<number> <name>=<number> ...

Numbers are written with up to 6 significant digits in Python's `g` format (1.5e-05, 0.1234).
Progress lines (`[progress] ...`) and metric lines come from the leader only. TensorBoard
event files go to <output>/tensorboard when the tensorboard package is installed.
"""

from __future__ import annotations

import datetime
import importlib.util
import sys
import threading
from typing import Mapping, TextIO


def format_number(value: float) -> str:
    return f"{value:.6g}"


def format_metrics(epoch: int, step: int, values: Mapping[str, float]) -> str:
    parts = [f"epoch={epoch}", f"step={step}"] + [f"{k}={format_number(v)}" for k, v in values.items()]
    return "[metrics] " + " ".join(parts)


def format_eta(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(max(0.0, seconds))))


def format_progress(epoch: int, epochs: int, step: int, total_steps: int, loss: float,
                    samples_per_s: float, eta_s: float) -> str:
    percent = 100.0 * step / max(1, total_steps)
    return (f"[progress] epoch {epoch + 1}/{epochs} step {step}/{total_steps} ({percent:.0f}%)"
            f" loss {loss:.4f} {samples_per_s:,.0f} samples/s ETA {format_eta(eta_s)}")


class Reporter:
    """Writes metric and progress lines (leader only) and, when available, TensorBoard events.
    `line` may be called from any thread."""

    def __init__(self, is_leader: bool, tensorboard_dir: str | None, stream: TextIO | None = None):
        self.is_leader = is_leader
        self._stream = stream or sys.stdout
        self._writer = None
        self._lock = threading.Lock()  # lines come from the training thread and the checkpoint writer
        if is_leader and tensorboard_dir and importlib.util.find_spec("tensorboard") is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=tensorboard_dir)

    def line(self, text: str) -> None:
        if self.is_leader:
            with self._lock:  # one write per line: two threads' lines never interleave
                self._stream.write(text + "\n")
                self._stream.flush()

    def metrics(self, epoch: int, step: int, values: Mapping[str, float]) -> None:
        if not self.is_leader:
            return
        self.line(format_metrics(epoch, step, values))
        if self._writer is not None:
            for name, value in values.items():
                self._writer.add_scalar(name, value, step)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

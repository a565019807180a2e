"""What train/'s scripts tell the job report beyond what the rank wrapper sees by itself: the
time a step waits for its data, mpi4py's all-reduce wait (not torch.distributed's: the wrapper
times those), the samples a step trains on (for samples a second), and the step a run resumed
from (the steps a failure made it redo).

The image's rank wrapper (entrypoint/rank/step_figures.py) registers itself as
sys.modules["byoc_rank_figures"] when the report is on (BYOC_REPORT); without it these cost a
dictionary lookup and do nothing, so the scripts run the same anywhere.
"""

from __future__ import annotations

import contextlib
import sys
import time

FIGURES_MODULE = "byoc_rank_figures"


@contextlib.contextmanager
def timed_as(kind: str):
    """Adds the block's time to the step's `kind`: "data_wait" or "wait"."""
    figures = sys.modules.get(FIGURES_MODULE)
    if figures is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        getattr(figures, f"add_{kind}")(time.perf_counter() - started)


def add_samples(count: int) -> None:
    figures = sys.modules.get(FIGURES_MODULE)
    if figures is not None:
        figures.add_samples(count)


def set_resumed_step(step: int) -> None:
    figures = sys.modules.get(FIGURES_MODULE)
    if figures is not None:
        figures.set_resumed_step(step)

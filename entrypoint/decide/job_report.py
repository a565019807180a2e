"""What the plan decides for the job report (pure, and light: the plan imports it on every start)."""

from __future__ import annotations

import os
from typing import NamedTuple

REPORT_DIR_ENV = "BYOC_REPORT_DIR"  # where the ranks write their step figures (rank/step_figures.py)


class ReportSpec(NamedTuple):
    """What the plan decides for the report (decide_report_spec); None in the plan: off."""

    rank_folder: str  # BYOC_REPORT_DIR: this job's runtime folder's report/, the same path on every host
    interval_s: float
    gpu_count: int
    neuron_cores: int
    # The job watched live (jobreport/live/): our TensorBoard events' folder (None: none
    # written), how often the live figures move (TensorBoard, the workers' to the leader) and
    # the status line's interval (0: no status line).
    tensorboard_dir: str | None
    live_interval_s: float
    status_interval_s: float


TENSORBOARD_SUBFOLDER = "byoc-job"  # ours, beside the script's own event files (a run of its own)


def decide_tensorboard_dir(switch: bool | None, configured_path: str | None, default_path: str) -> str | None:
    """Our events' folder: a TensorBoard output config's LocalPath (SageMaker syncs it to S3
    while the job runs), or the default path with BYOC_TENSORBOARD=1; BYOC_TENSORBOARD=0 turns
    them off even with a config. Always our own subfolder: the script's files are left alone."""
    if switch is False or (switch is None and configured_path is None):
        return None
    return os.path.join(configured_path or default_path, TENSORBOARD_SUBFOLDER)


def decide_report_spec(enabled: bool, interval_s: float, runtime_folder: str, gpu_count: int,
                       neuron_cores: int, tensorboard_dir: str | None, live_interval_s: float,
                       status_interval_s: float) -> ReportSpec | None:
    if not enabled:
        return None
    return ReportSpec(os.path.join(runtime_folder, "report"), interval_s, gpu_count, neuron_cores, tensorboard_dir,
                      live_interval_s, status_interval_s)

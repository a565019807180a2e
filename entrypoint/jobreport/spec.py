"""What the plan decides for the job report (pure, and light: the plan imports it on every start)."""

from __future__ import annotations

import os
from typing import NamedTuple

HOST_FIGURES_FILE = "host-figures.json"  # an MPI worker's figures, in rank_folder, read by the leader over SSH
REPORT_DIR_ENV = "BYOC_REPORT_DIR"  # where the ranks write their step figures (rank/step_figures.py)


class ReportSpec(NamedTuple):
    """What the plan decides for the report (decide_report_spec); None in the plan: off."""

    rank_folder: str  # BYOC_REPORT_DIR: this job's runtime folder's report/, the same path on every host
    interval_s: float
    gpu_count: int
    neuron_cores: int


def decide_report_spec(enabled: bool, interval_s: float, runtime_folder: str, gpu_count: int,
                       neuron_cores: int) -> ReportSpec | None:
    if not enabled:
        return None
    return ReportSpec(os.path.join(runtime_folder, "report"), interval_s, gpu_count, neuron_cores)

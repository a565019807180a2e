"""Where a training script reads and writes, from the SageMaker environment.

The toolkit exports SM_MODEL_DIR, SM_OUTPUT_DIR, SM_INPUT_DIR, ...; a script launched by plain
torchrun/mpirun has none of them, so each falls back to its place under /opt/ml (or under
SAGEMAKER_BASE_DIR, which the toolkit also honours). The checkpoint folder comes from
checkpointconfig.json's LocalPath when present.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Mapping

DEFAULT_BASE_DIR = "/opt/ml"
DEFAULT_CHECKPOINT_DIR = "/opt/ml/checkpoints"


@dataclass(frozen=True)
class JobPaths:
    input_data_dir: str
    input_config_dir: str
    model_dir: str
    output_dir: str
    checkpoint_dir: str

    @property
    def tensorboard_dir(self) -> str:
        return os.path.join(self.output_dir, "tensorboard")

    @property
    def checkpoint_config_file(self) -> str:
        return os.path.join(self.input_config_dir, "checkpointconfig.json")


def parse_job_paths(environ: Mapping[str, str], checkpoint_config: Mapping | None = None) -> JobPaths:
    base = environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR
    input_dir = environ.get("SM_INPUT_DIR") or os.path.join(base, "input")
    checkpoint_dir = (
        (checkpoint_config or {}).get("LocalPath")
        or (os.path.join(base, "checkpoints") if environ.get("SAGEMAKER_BASE_DIR") else DEFAULT_CHECKPOINT_DIR)
    )
    return JobPaths(
        input_data_dir=os.path.join(input_dir, "data"),
        input_config_dir=environ.get("SM_INPUT_CONFIG_DIR") or os.path.join(input_dir, "config"),
        model_dir=environ.get("SM_MODEL_DIR") or os.path.join(base, "model"),
        output_dir=environ.get("SM_OUTPUT_DIR") or os.path.join(base, "output"),
        checkpoint_dir=checkpoint_dir,
    )


def load_job_paths(environ: Mapping[str, str]) -> JobPaths:
    """parse_job_paths plus checkpointconfig.json when the job has one."""
    paths = parse_job_paths(environ)
    try:
        with open(paths.checkpoint_config_file, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        return paths
    except json.JSONDecodeError as err:
        raise ValueError(f"{paths.checkpoint_config_file} is not valid JSON: {err}") from None
    return parse_job_paths(environ, config)

"""Where things live under the SageMaker root (/opt/ml, or SAGEMAKER_BASE_DIR as the toolkit allows)."""

from __future__ import annotations

import os
from typing import NamedTuple

DEFAULT_BASE_DIR = "/opt/ml"


class MlPaths(NamedTuple):
    base: str
    # The user's code when it is not base/code: an SDK v3 job's `code` channel
    # (job/v3_definition.py), where v3's sm_train.sh cds to run it.
    code: str | None = None

    @property
    def input_dir(self) -> str:
        return os.path.join(self.base, "input")

    @property
    def input_config_dir(self) -> str:
        return os.path.join(self.input_dir, "config")

    @property
    def input_data_dir(self) -> str:
        return os.path.join(self.input_dir, "data")

    @property
    def code_dir(self) -> str:
        return self.code or os.path.join(self.base, "code")

    @property
    def model_dir(self) -> str:
        return os.path.join(self.base, "model")

    @property
    def output_dir(self) -> str:
        return os.path.join(self.base, "output")

    @property
    def output_data_dir(self) -> str:
        return os.path.join(self.output_dir, "data")

    @property
    def output_intermediate_dir(self) -> str:
        return os.path.join(self.output_dir, "intermediate")

    @property
    def failure_file(self) -> str:
        return os.path.join(self.output_dir, "failure")

    @property
    def success_file(self) -> str:
        return os.path.join(self.output_dir, "success")

    def config_file(self, name: str) -> str:
        return os.path.join(self.input_config_dir, name)

    def channel_dir(self, channel: str) -> str:
        return os.path.join(self.input_data_dir, channel)


def build_paths(environ: dict[str, str]) -> MlPaths:
    return MlPaths(base=environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR)

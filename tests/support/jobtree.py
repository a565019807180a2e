"""Build SageMaker /opt/ml trees for tests, as SageMaker (and the SDK) would write them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.ports import decide_master_port

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def write_tree(
    root: Path,
    *,
    hosts=("algo-1",),
    current_host="algo-1",
    hyperparameters: dict | None = None,
    channels: dict | None = None,
    resource_extra: dict | None = None,
    script: str | None = None,
    program: str = "train.py",
    encode_hyperparameters: bool = True,
    channel_files: dict[str, dict[str, bytes]] | None = None,
) -> Path:
    """Write an /opt/ml tree. Hyperparameters are JSON-encoded per value like SDK >= 2.110.
    channel_files: {channel: {file name: bytes}}, File-mode channels with their data (added
    to `channels` when not there)."""
    channels = {**{name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"}
                   for name in (channel_files or {})}, **(channels or {})}
    for sub in ("input/config", "code", "model", "output"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    resource = {"current_host": current_host, "hosts": list(hosts), **(resource_extra or {})}
    (root / "input/config/resourceconfig.json").write_text(json.dumps(resource))
    hps = {"sagemaker_program": program, **(hyperparameters or {})}
    if encode_hyperparameters:
        hps = {k: json.dumps(v) for k, v in hps.items()}
    (root / "input/config/hyperparameters.json").write_text(json.dumps(hps))
    (root / "input/config/inputdataconfig.json").write_text(
        json.dumps({name: spec for name, spec in channels.items()})
    )
    for name, spec in channels.items():
        if spec.get("TrainingInputMode", "File") != "Pipe":
            (root / "input/data" / name).mkdir(parents=True, exist_ok=True)
    for name, files in (channel_files or {}).items():
        for file_name, data in files.items():
            (root / "input/data" / name / file_name).write_bytes(data)
    if script is not None:
        (root / "code" / program).parent.mkdir(parents=True, exist_ok=True)
        (root / "code" / program).write_text(script)
    return root


def entrypoint_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_", "BYOC_"))}
    env["SAGEMAKER_BASE_DIR"] = str(root)
    env["PYTHONPATH"] = str(REPO)
    env["BYOC_MASTER_PORT"] = str(decide_master_port(os.environ))  # the job port and the health check's follow it
    env.update(extra)
    return env


def run_entrypoint(root: Path, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "entrypoint", "train", *args],
        env=entrypoint_env(root, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
    )


def failure_text(root: Path) -> str:
    return (root / "output/failure").read_text()

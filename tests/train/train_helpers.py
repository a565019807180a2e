"""Shared helpers for the train/ tests: a small job tree and real launches (torchrun, mpirun,
the local parameter-server topology), one thread per rank."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.ports import free_port  # noqa: F401 - the train tests take it from here

PYTHON = sys.executable
MPIRUN = shutil.which("mpirun")
needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="Open MPI's mpirun is not installed (apt-get install openmpi-bin)")


def has_horovod() -> bool:
    import importlib.util

    return importlib.util.find_spec("horovod") is not None


needs_horovod = pytest.mark.skipif(
    not has_horovod(),
    reason="horovod not installed: bash scripts/build-horovod-wheel.sh, then "
           "pip install --find-links ~/.cache/byoc-wheelhouse -e '.[test,horovod]'")


def make_tables(n: int, features: int = 12, classes: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, features)) * 2
    y = rng.integers(0, classes, size=n)
    x = centers[y] + rng.normal(size=(n, features))
    return x.astype(np.float32), y.astype(np.int64)


def npz_bytes(x, y) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=x, y=y)
    return buffer.getvalue()


def write_job(root: Path, n_train: int = 96, n_validation: int = 40, shards: int = 3,
              input_config: dict | None = None) -> Path:
    x, y = make_tables(n_train + n_validation)
    train_dir, val_dir = root / "input/data/train", root / "input/data/validation"
    train_dir.mkdir(parents=True)
    val_dir.mkdir(parents=True)
    for i, part in enumerate(np.array_split(np.arange(n_train), shards)):
        (train_dir / f"part-{i}.npz").write_bytes(npz_bytes(x[part], y[part]))
    (val_dir / "val.npz").write_bytes(npz_bytes(x[n_train:], y[n_train:]))
    if input_config is not None:
        (root / "input/config").mkdir(parents=True, exist_ok=True)
        (root / "input/config/inputdataconfig.json").write_text(json.dumps(input_config))
    return root


def job_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SM_", "OMPI_", "PMIX_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_",
                                "TORCHELASTIC", "HOROVOD_", "BYOC_"))}
    env.update({"SAGEMAKER_BASE_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    return env


def torchrun_argv(nproc: int, module: str, args: list[str]) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), "-m", module, *args]


def mpirun_argv(nproc: int, module: str, args: list[str], env_names=("SAGEMAKER_BASE_DIR", "OMP_NUM_THREADS")) -> list[str]:
    exports = [item for name in ("PATH", *env_names) for item in ("-x", name)]
    return [MPIRUN, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(nproc), *exports,
            PYTHON, "-m", module, *args]


def horovodrun_argv(nproc: int, module: str, args: list[str]) -> list[str]:
    horovodrun = os.path.join(os.path.dirname(PYTHON), "horovodrun")
    return [horovodrun, "-np", str(nproc), "-H", f"localhost:{nproc}", "--gloo", PYTHON, "-m", module, *args]


def ps_argv(hosts: int, workers_per_host: int, args: list[str]) -> list[str]:
    return [PYTHON, "-m", "jobs.ps_local", "--hosts", str(hosts), "--workers-per-host", str(workers_per_host),
            "--", PYTHON, "-m", "train.ps_train", *args]


def run(argv: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{argv} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
                             f"\n--- stderr\n{result.stderr[-4000:]}")
    return result


def load_saved_state(root: Path) -> dict:
    import torch

    return torch.load(root / "model" / "model.pt")["state_dict"]

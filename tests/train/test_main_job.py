"""The default job end to end: prepare it, run its entry script with plain torchrun (2 ranks)
and the job's hyperparameters as SageMaker passes them, get >= 0.95 validation accuracy and
a model file that plain torch.load reads."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import torch

from tests.train.train_helpers import PYTHON, job_env, run, torchrun_argv
from train.models import load_model
from train.records import load_table_folder


def build_user_args(hyperparameters: dict[str, str]) -> list[str]:
    """What the toolkit hands the script: user keys sorted, `--key value`, non-strings as JSON."""
    args = []
    for key in sorted(hyperparameters):
        if key.startswith("sagemaker_"):
            continue
        value = json.loads(hyperparameters[key])
        args += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return args


@pytest.mark.slow
def test_digits_job_with_torchrun_two_ranks(tmp_path):
    subprocess.run([PYTHON, "-m", "jobs.main_job", "--root", str(tmp_path), "--backend", "ddp",
                    "--processes-per-host", "2"], check=True, capture_output=True)
    hyperparameters = json.loads((tmp_path / "input/config/hyperparameters.json").read_text())
    entry = tmp_path / "code" / json.loads(hyperparameters["sagemaker_program"])
    argv = torchrun_argv(2, "x", build_user_args(hyperparameters))
    argv = argv[:argv.index("-m", 3)] + [str(entry), *build_user_args(hyperparameters)]
    out = run(argv, job_env(tmp_path), timeout=300).stdout

    result = re.search(r"\[result\] validation_accuracy=([0-9.]+) model=(\S+)", out)
    assert result, out
    assert float(result.group(1)) >= 0.95
    model_path = result.group(2)
    assert model_path == str(tmp_path / "model" / "model.pt")
    assert torch.load(model_path)["arch"]["in_features"] == 64

    validation = load_table_folder(str(tmp_path / "input/data/validation"))
    model = load_model(model_path).eval()
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(validation.x)).argmax(1).numpy() == validation.y).mean()
    assert accuracy == pytest.approx(float(result.group(1)), abs=1e-4)

"""benchmarks/localmode.py's pure parts: which image runs which case, and the floor image's job."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

REPO = Path(__file__).resolve().parents[2]


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("bench_localmode", REPO / "benchmarks" / "localmode.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_floor_image_stands_in_for_the_one_host_job_only():
    bench = _load_benchmark()
    runs = {case.name for case in bench.CASES if bench.decide_runs(case, "floor")}
    assert runs == {"1 host"}
    assert all(bench.decide_runs(case, "ours") and bench.decide_runs(case, "baseline") for case in bench.CASES)


def test_floor_train_writes_what_the_one_host_job_writes(tmp_path):
    """The floor's `train` must do the 1-host job's visible work (one file in the model dir),
    or the comparison is not like for like. Run with /opt/ml/model pointed at a temp folder."""
    train = (REPO / "benchmarks" / "floor" / "train").read_text()
    assert os.access(REPO / "benchmarks" / "floor" / "train", os.X_OK)
    model = tmp_path / "model"
    model.mkdir()
    done = subprocess.run(["sh", "-c", train.replace("/opt/ml/model", str(model))], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (model / "done.json").read_text().strip() == '{"host": "floor"}'
    assert 'os.path.join(os.environ["SM_MODEL_DIR"], "done.json")' in _load_benchmark().ONE_HOST

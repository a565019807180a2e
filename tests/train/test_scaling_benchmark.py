"""The pieces of benchmarks/training_scaling.py that decide what is measured and how it is
summarized (the runs themselves are the benchmark, not a test)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from jobs.main_job import load_digits_split

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "training_scaling.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("training_scaling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiled_split_repeats_only_training_images_each_equally_often(bench):
    split = load_digits_split()
    tiled = bench.build_tiled_split(split, 2 * 4 * 2048)
    assert len(tiled.train) >= 2 * 4 * 2048 and len(tiled.train) % len(split.train) == 0
    copies = len(tiled.train) // len(split.train)
    rows = {row.tobytes(): 0 for row in split.train.x}
    for row in tiled.train.x:
        rows[row.tobytes()] += 1  # a KeyError would mean an image that is not a training image
    assert sum(rows.values()) == len(tiled.train)
    assert tiled.validation is split.validation
    # labels travel with their images
    index = {row.tobytes(): label for row, label in zip(split.train.x, split.train.y)}
    assert all(index[row.tobytes()] == label for row, label in zip(tiled.train.x[:500], tiled.train.y[:500]))
    assert copies >= 11
    assert not np.array_equal(tiled.train.x[:len(split.train)], split.train.x)  # shuffled, not stacked


def test_paired_efficiency_follows_each_repeat(bench):
    # The machine slows to half speed between the two runs of repeat 3 and stays slow: the
    # ratio of the medians says 0.45; paired by repeat, four of five repeats say 0.9.
    samples = {"ddp-1": [100.0, 100.0, 100.0, 50.0, 50.0], "ddp-2": [180.0, 180.0, 90.0, 90.0, 90.0]}
    assert bench.summarize(samples | {"mpi4py-2": [1.0] * 5}, 512, np.median)["scaling_efficiency"]["ddp-2"] \
        == pytest.approx(0.45)
    assert bench.build_paired_efficiency(samples, "ddp-2") == pytest.approx(0.9)
    summary = bench.summarize(samples | {"mpi4py-2": [200.0] * 5}, 512, max)  # best runs: 180 / (2 x 100)
    assert summary["scaling_efficiency"]["ddp-2"] == pytest.approx(0.9)
    assert summary["step_ms"]["ddp-2"] == pytest.approx(1000 * 1024 / 180)
    assert summary["mpi4py_step_vs_ddp"] == pytest.approx(180 / 200)

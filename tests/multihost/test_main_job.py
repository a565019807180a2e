"""The README's main job on 2 emulated hosts through the entrypoint: DDP by default, and the
parameter server (torch.distributed.rpc, one shard per host plus the workers)."""

import re
import subprocess
import sys

import pytest
import torch

from support.multihost import needs_root

pytestmark = [needs_root, pytest.mark.slow]


@pytest.mark.parametrize("backend", ["ddp", "ps"])
def test_main_job_trains_digits_on_two_hosts(tmp_path, backend):
    done = subprocess.run(
        [sys.executable, "-m", "train.run_main_job", "--backend", backend, "--work", str(tmp_path / "job")],
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    out = done.stdout
    assert "[algo-2] " in out and "[progress] epoch" in out  # both hosts ran; readable progress
    accuracy = float(re.search(r"^validation accuracy: ([0-9.]+)$", out, re.M).group(1))
    assert accuracy >= 0.95
    model_path = re.search(r"^saved model: (\S+)$", out, re.M).group(1)
    state = torch.load(model_path, weights_only=False)
    assert state  # plain torch.load reads it

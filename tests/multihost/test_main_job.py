"""The README's main job with --emulated: 2 emulated hosts through the entrypoint, DDP and the
parameter server (torch.distributed.rpc). As users run it (SDK v2 local mode):
tests/localmode/test_main_job.py."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.multihost import needs_root

pytestmark = [needs_root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", ["ddp", "ps"])
def test_main_job_trains_digits_on_two_emulated_hosts(tmp_path, backend):
    done = subprocess.run(
        [sys.executable, "-m", "jobs.run_main_job", "--emulated", "--backend", backend, "--work", str(tmp_path / "job")],
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

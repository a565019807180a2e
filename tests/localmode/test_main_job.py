"""The README's main job, `bash scripts/run-main-job.sh`, for real, as users run it: the CPU
image built from this tree, the SageMaker SDK v2 PyTorch estimator in local mode on 2 instances
(torchrun + DDP). With --emulated: tests/multihost/test_main_job.py."""

import re
import subprocess
import tarfile
from pathlib import Path

import pytest
import torch

from entrypoint.job.archive import extract_tar
from support.multihost import needs_root

pytestmark = [needs_root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_main_job_as_users_run_it_sdk_v2_local_mode(tmp_path):
    done = subprocess.run(["bash", str(REPO / "scripts" / "run-main-job.sh"), "--work", str(tmp_path / "job")],
                          capture_output=True, text=True, timeout=1500)
    out = done.stdout
    assert done.returncode == 0, out[-6000:] + done.stderr[-3000:]
    # The image was built once, beside the set-up, and the job took it as built (no second build).
    assert re.search(r"^main job: the CPU image \S+ \(built just now\)$", out, re.M), out[:3000]
    # Progress streamed from both local-mode containers: compose prefixes each line with the
    # container's name, <random>-algo-N-<job suffix>.
    assert re.search(r"^\w+-algo-1-\w+\s+\|.*\[progress\] epoch", out, re.M), out[-4000:]
    # The second host ran its part and both ranks ended with the same parameters. Not its own
    # "succeeded" line: both torchruns end together, and compose's abort-on-container-exit can
    # stop algo-2 in the milliseconds between the leader's exit and that line (seen in CI).
    assert re.search(r"^\w+-algo-2-\w+\s+\| \[entrypoint\] algo-2-\w+: running torchrun on 2 host\(s\)", out, re.M), out[-4000:]
    assert re.search(r"^\w+-algo-1-\w+\s+\| \[entrypoint\] algo-1-\w+: torchrun on 2 host\(s\) succeeded", out, re.M), out[-4000:]
    assert re.search(r"^\w+-algo-1-\w+\s+\| \[check\] parameters identical on all 2 ranks", out, re.M), out[-4000:]
    accuracy = float(re.search(r"^validation accuracy: ([0-9.]+)$", out, re.M).group(1))
    assert accuracy >= 0.9
    model_tar = Path(re.search(r"^model\.tar\.gz: (\S+) \(holds model\.pt", out, re.M).group(1))
    assert model_tar.is_file() and model_tar.is_relative_to(tmp_path / "job")
    with tarfile.open(model_tar) as tar:
        assert "model.pt" in tar.getnames()
    extract_tar(str(model_tar), str(tmp_path / "model"))  # no filter= on Debian 12's Python 3.11.2
    state = torch.load(tmp_path / "model" / "model.pt", weights_only=False)
    assert state["arch"]["in_features"] == 64  # the digits MLP, readable with plain torch.load
    fit_seconds = re.search(r"^fit\(\) took (\S+) s", out, re.M).group(1)
    print(f"\n[fit] main job via SDK v2: {fit_seconds} s, accuracy {accuracy}")

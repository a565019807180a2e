"""A run stopped at step k and started again resumes from its checkpoint and ends with
weights bit-identical to an uninterrupted run (2 DDP ranks under torchrun)."""

from __future__ import annotations

import signal
import subprocess

import psutil
import pytest
import torch

from support.output import read_lines_until
from tests.train.train_helpers import (job_env, load_saved_state, mpirun_argv, needs_horovod, needs_mpirun, ps_argv, run,
                                      torchrun_argv, write_job)

ARGS = ["--epochs", "50", "--max_steps", "300", "--batch_size", "8", "--lr", "0.002", "--hidden_sizes", "[256, 256]",
        "--seed", "5", "--log_every", "5", "--warmup_epochs", "2", "--optimizer", "adam"]

pytestmark = pytest.mark.slow


def start(root, extra=()):
    return subprocess.Popen(torchrun_argv(2, "train.ddp_train", ARGS + list(extra)), env=job_env(root),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = write_job(tmp_path_factory.mktemp("straight"))
    out = run(torchrun_argv(2, "train.ddp_train", ARGS), job_env(root)).stdout
    assert "step=300" in out and "resumed" not in out
    return load_saved_state(root)


def test_sigterm_checkpoints_and_the_next_start_resumes_bit_identical(tmp_path, uninterrupted):
    root = write_job(tmp_path)
    first = start(root, ["--checkpoint_every", "0"])  # the only checkpoint is the SIGTERM one
    read_lines_until(first, "step 20/300")
    first.send_signal(signal.SIGTERM)  # to torchrun, which passes it to its ranks
    output, _ = first.communicate(timeout=60)
    assert "[stopped] SIGTERM" in output, output
    assert (root / "checkpoints" / "checkpoint.pt").exists()
    stopped_at = torch.load(root / "checkpoints" / "checkpoint.pt")["step"]
    assert 20 <= stopped_at < 300
    assert not (root / "model" / "model.pt").exists()

    second = run(torchrun_argv(2, "train.ddp_train", ARGS + ["--checkpoint_every", "0"]), job_env(root)).stdout
    assert f"resumed from {root / 'checkpoints'} at step {stopped_at}" in second
    assert_bit_identical(uninterrupted, load_saved_state(root))


def test_killed_after_a_periodic_checkpoint_resumes_bit_identical(tmp_path, uninterrupted):
    root = write_job(tmp_path)
    first = start(root, ["--checkpoint_every", "30"])
    read_lines_until(first, "[checkpoint] saved step 60")
    # torchrun and every rank at once (ranks run in their own process groups): no chance to
    # save anything more, the periodic checkpoint must do.
    ranks = psutil.Process(first.pid).children(recursive=True)
    first.kill()
    for rank in ranks:
        rank.kill()
    first.wait(timeout=30)
    _gone, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive
    step = torch.load(root / "checkpoints" / "checkpoint.pt")["step"]
    assert step % 30 == 0 and step >= 60

    second = run(torchrun_argv(2, "train.ddp_train", ARGS + ["--checkpoint_every", "30"]), job_env(root)).stdout
    assert f"at step {step}" in second
    assert_bit_identical(uninterrupted, load_saved_state(root))


SHORT = ["--epochs", "5", "--max_steps", "12", "--checkpoint_every", "6", "--batch_size", "8", "--lr", "0.05",
         "--hidden_sizes", "[32]", "--seed", "6", "--log_every", "3"]


@pytest.mark.parametrize("launch", [
    pytest.param(lambda args: mpirun_argv(2, "train.horovod_train", args), id="horovod",
                 marks=[needs_mpirun, needs_horovod]),
    pytest.param(lambda args: mpirun_argv(2, "train.mpi_train", args + ["--bucket_mb", "0.001"]), id="mpi4py",
                 marks=needs_mpirun),
    pytest.param(lambda args: ps_argv(2, 1, args), id="ps"),  # shard optimizer state in the checkpoint
])
def test_every_trainer_resumes_bit_identical(tmp_path, launch):
    """Run 12 steps (checkpoint at step 6); start again on the same folder: it resumes at 6 and
    must end with exactly the weights of the run that went straight through."""
    root = write_job(tmp_path)
    first = run(launch(SHORT), job_env(root)).stdout
    assert "[checkpoint] saved step 6" in first and "resumed" not in first
    straight = load_saved_state(root)
    (root / "model" / "model.pt").unlink()
    second = run(launch(SHORT), job_env(root)).stdout
    assert "resumed from" in second and "at step 6" in second
    assert_bit_identical(straight, load_saved_state(root))

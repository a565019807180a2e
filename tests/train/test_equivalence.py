"""Data parallelism changes nothing but speed: after K steps with 2 ranks, DDP, Horovod,
mpi4py and the synchronous parameter server hold the weights of ONE process trained on the
concatenated batches (global batch = 2 x per-rank batch, lr = the 2-rank peak lr), and every
rank of the allreduce trainers holds identical weights (the loop's digest check).

Tolerance: |a - b| <= 1e-5 + 1e-4 |b| per element (float32; a sum over 2 ranks of means over
8 records is not rounded like one mean over 16). Measured differences are ~1e-7.
"""

from __future__ import annotations

import pytest
import torch

from tests.train.train_helpers import (PYTHON, horovodrun_argv, job_env, load_saved_state, mpirun_argv, needs_horovod, needs_mpirun, ps_argv, run,
                      torchrun_argv, write_job)

K_STEPS = 12  # two epochs of 6 global batches of 16: includes a reshuffle
COMMON = ["--epochs", "3", "--max_steps", str(K_STEPS), "--log_every", "4", "--checkpoint_every", "0",
          "--hidden_sizes", "[32, 16]", "--seed", "3", "--momentum", "0.9"]
PER_RANK = ["--batch_size", "8", "--lr", "0.05"]  # 2 ranks: peak lr 0.1 (linear scaling rule)
REFERENCE = ["--batch_size", "16", "--lr", "0.1"]  # 1 rank: the same global batch and lr

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = write_job(tmp_path_factory.mktemp("reference"))
    run([torchrun_argv(1, "train.ddp_train", COMMON + REFERENCE)[0], "-m", "train.ddp_train", *COMMON, *REFERENCE],
        job_env(root))
    return load_saved_state(root)


def assert_matches(reference: dict, state: dict) -> None:
    assert reference.keys() == state.keys()
    for name, expected in reference.items():
        torch.testing.assert_close(state[name], expected, rtol=1e-4, atol=1e-5, msg=name)
    # ...and training did move the weights, so the comparison means something.
    assert any(not torch.equal(reference[n], torch.zeros_like(reference[n])) for n in reference)


def check_run(tmp_path, argv_builder, reference, replicas_checked=True) -> str:
    root = write_job(tmp_path)
    result = run(argv_builder(COMMON + PER_RANK), job_env(root))
    assert_matches(reference, load_saved_state(root))
    if replicas_checked:
        assert "[check] parameters identical on all 2 ranks" in result.stdout
    assert f"step={K_STEPS}" in result.stdout
    return result.stdout


def test_ddp_two_ranks_match_one_process(tmp_path, reference):
    check_run(tmp_path, lambda args: torchrun_argv(2, "train.ddp_train", args), reference)


@needs_mpirun
def test_ddp_under_mpirun_matches_one_process(tmp_path, reference):
    # No MASTER_ADDR: rank 0 publishes its address over MPI (the pytorchddp launch).
    check_run(tmp_path, lambda args: mpirun_argv(2, "train.ddp_train", args), reference)


@needs_mpirun
@needs_horovod
def test_horovod_two_ranks_match_one_process(tmp_path, reference):
    check_run(tmp_path, lambda args: mpirun_argv(2, "train.horovod_train", args), reference)


@needs_horovod
def test_horovod_under_horovodrun_gloo_matches_one_process(tmp_path, reference):
    check_run(tmp_path, lambda args: horovodrun_argv(2, "train.horovod_train", args), reference)


@needs_mpirun
def test_mpi4py_two_ranks_match_one_process(tmp_path, reference):
    # Small buckets: several Iallreduces in flight during one backward pass.
    check_run(tmp_path, lambda args: mpirun_argv(2, "train.mpi_train", args + ["--bucket_mb", "0.001"]), reference)


@needs_mpirun
def test_mpi4py_as_sagemaker_runs_it_matches_one_process(tmp_path, reference):
    # The toolkit's MPI launch: python -m mpi4py <script> (here the module form), one bucket.
    def argv(args):
        launch = mpirun_argv(2, "train.mpi_train", args)
        at = launch.index(PYTHON)
        return launch[:at + 1] + ["-m", "mpi4py", "-m", "train.mpi_train", *args]
    check_run(tmp_path, argv, reference)


def test_sync_parameter_server_matches_one_process(tmp_path, reference):
    check_run(tmp_path, lambda args: ps_argv(2, 1, args), reference, replicas_checked=False)

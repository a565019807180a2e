"""Faults on 2 emulated hosts, for mpirun and torchrun, through the real entrypoint. In every
case: every host exits non-zero within 60 s, nothing of the job is left running, and the
failure names what failed first within its first 1,024 characters."""

import os
import signal
import time

import pytest

from localcluster import EmulatedCluster
from support.multihost import assert_nothing_left, failure, job, needs_root, start, wait_for_files

pytestmark = [needs_root, pytest.mark.slow]

LAUNCHERS = {"mpi": ("mpi_job.py", "mpi"), "torchrun": ("torch_job.py", "torch_distributed")}
HOSTS = ["algo-1", "algo-2"]


def run_with_fault(launcher, hps, inject=None):
    program, distribution = LAUNCHERS[launcher]
    with EmulatedCluster(HOSTS, job(program, distribution, **hps)) as cluster:
        run = start(cluster)
        fault_at = time.monotonic()
        if inject is not None:
            wait_for_files(cluster.model_dir, "started-", 2, timeout=90)
            fault_at = time.monotonic()
            inject(cluster, run)
        result = run.wait(timeout=120, fail_fast=False)
        took = time.monotonic() - fault_at
        assert_nothing_left(cluster)
        failures = {h: failure(cluster, h) for h in HOSTS if os.path.exists(os.path.join(cluster.opt_ml(h), "output", "failure"))}
        return result, took, failures, sorted(os.listdir(cluster.model_dir))


def assert_every_host_failed(result, took):
    for host, r in result.results.items():
        assert r.returncode != 0, f"{host} exited 0:\n{r.output[-2000:]}"
    assert took < 60, f"hosts took {took:.0f} s to exit"


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_rank_raises_on_a_worker_host(launcher):
    result, took, failures, _ = run_with_fault(launcher, {"fail": "worker"})
    assert_every_host_failed(result, took)
    head = failures["algo-1"][:1024]
    assert head.startswith("RuntimeError: injected failure on algo-2\n"), head
    assert "rank 1 on host algo-2" in head


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_rank_raises_on_the_leader(launcher):
    result, took, failures, _ = run_with_fault(launcher, {"fail": "leader"})
    assert_every_host_failed(result, took)
    head = failures["algo-1"][:1024]
    assert head.startswith("RuntimeError: injected failure on algo-1\n"), head
    assert "rank 0 on host algo-1" in head


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_worker_host_dies_mid_run(launcher):
    result, took, failures, _ = run_with_fault(launcher, {"hold": 90}, lambda c, run: c.kill_host("algo-2"))
    assert_every_host_failed(result, took)
    assert "algo-2" in failures["algo-1"][:1024]


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_leader_host_dies_mid_run(launcher):
    result, took, failures, _ = run_with_fault(launcher, {"hold": 90}, lambda c, run: c.kill_host("algo-1"))
    assert_every_host_failed(result, took)
    assert "algo-1" in failures["algo-2"][:1024]


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_sigterm_to_every_host_reaches_the_script(launcher):
    result, took, failures, model_files = run_with_fault(launcher, {"hold": 90}, lambda c, run: run.signal(signal.SIGTERM))
    assert_every_host_failed(result, took)
    # Every rank's SIGTERM handler ran (it would checkpoint there).
    assert [n for n in model_files if n.startswith("sigterm-")] == ["sigterm-0", "sigterm-1"]
    assert "SIGTERM" in failures["algo-1"][:1024]

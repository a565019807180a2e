"""CPU ranks on their own cores, and gloo's I/O thread out of the way of the rank's work.

Why (docs/training.md, Benchmark): with two ranks on two cores and nothing bound, gloo's TCP
thread spins on the other rank's core while the worker it waits for cannot run; the DDP
2-rank scaling efficiency at 512 records per rank was 0.64. Bound, with the I/O thread as
SCHED_IDLE, 0.81.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.train.train_helpers import MPIRUN, PYTHON, free_port, job_env, needs_horovod, needs_mpirun
from train.config import TrainConfig, parse_config, HyperparameterError
from train.devices import CpuFacts, CpuPlan, decide_cpu_plan, decide_mpi_wait_env
from train.ranks import parse_rank_info

ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def facts(allowed, launcher="same") -> CpuFacts:
    return CpuFacts(tuple(allowed), tuple(allowed) if launcher == "same" else launcher)


@pytest.mark.parametrize("environ, cpu, local_rank, local_world_size, expected", [
    # one thread per rank on as many cores: a core each, in order
    (ONE_THREAD, facts((0, 1)), 0, 2, CpuPlan(1, (0,))),
    (ONE_THREAD, facts((0, 1)), 1, 2, CpuPlan(1, (1,))),
    # more cores than threads: the cores are still split evenly (room for the rank's helpers)
    (ONE_THREAD, facts(range(16)), 3, 4, CpuPlan(1, (12, 13, 14, 15))),
    # no OMP_NUM_THREADS: the cores shared out, each rank a contiguous slice
    ({}, facts((0, 1, 2, 3)), 1, 2, CpuPlan(2, (2, 3))),
    ({}, facts(range(8)), 2, 3, CpuPlan(2, (4, 5))),
    # a whole job limited to some cores (cgroup cpuset, taskset on the launcher): slices of those, sorted
    (ONE_THREAD, facts((9, 2, 7, 5)), 1, 4, CpuPlan(1, (5,))),
    # unknown launcher affinity: judged from this process's alone
    (ONE_THREAD, facts((0, 1), launcher=None), 1, 2, CpuPlan(1, (1,))),
    # alone on the host: nothing to keep apart
    (ONE_THREAD, facts((0, 1)), 0, 1, CpuPlan(1, None)),
    # the launcher did not say the local rank: every rank would take the first slice
    (ONE_THREAD, facts((0, 1)), None, 2, CpuPlan(1, None)),
    # the launcher placed the rank itself (mpirun --bind-to socket / core): left there
    (ONE_THREAD, facts(range(8, 16), launcher=tuple(range(16))), 1, 2, CpuPlan(1, None)),
    (ONE_THREAD, facts((1,), launcher=(0, 1)), 1, 2, CpuPlan(1, None)),
    # more threads asked for than there are cores: binding would only pile ranks together
    ({"OMP_NUM_THREADS": "4"}, facts((0, 1, 2, 3)), 0, 2, CpuPlan(4, None)),
])
def test_auto_binding_gives_each_local_rank_its_own_cores(environ, cpu, local_rank, local_world_size, expected):
    assert decide_cpu_plan(environ, cpu, local_rank, local_world_size, "auto") == expected


def test_binding_none_leaves_affinity_and_bad_values_are_refused():
    assert decide_cpu_plan(ONE_THREAD, facts((0, 1)), 1, 2, "none") == CpuPlan(1, None)
    with pytest.raises(ValueError, match="--cpu_binding 'cores'"):
        decide_cpu_plan(ONE_THREAD, facts((0, 1)), 1, 2, "cores")
    assert parse_config(["--cpu_binding", "none"]).cpu_binding == "none"
    assert TrainConfig().cpu_binding == "auto"
    with pytest.raises(HyperparameterError, match="cpu_binding"):
        parse_config(["--cpu_binding", "yes"])


def test_ranks_say_whether_the_launcher_gave_a_local_rank():
    assert parse_rank_info({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}).local_rank_known
    assert not parse_rank_info({"PMI_RANK": "1", "PMI_SIZE": "4"}).local_rank_known
    assert parse_rank_info({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
                            "MPI_LOCALNRANKS": "2"}).local_rank_known


def test_plan_is_reported_in_one_readable_field():
    assert CpuPlan(1, (0,)).describe() == "cpu_threads=1 cpu_cores=0"
    assert CpuPlan(2, (2, 3)).describe() == "cpu_threads=2 cpu_cores=2,3"
    assert CpuPlan(4, None).describe() == "cpu_threads=4 cpu_cores=unbound"


PROBE = """
import importlib, json, os, sys
from train.config import TrainConfig
from train.ddp_train import GLOO_IO_THREAD, find_threads
module, builder = sys.argv[1].split(":")
backend = getattr(importlib.import_module(module), builder)(TrainConfig(cpu_binding=sys.argv[2]), os.environ)
io_threads = find_threads(GLOO_IO_THREAD)
report = {"rank": backend.rank_info.rank, "affinity": sorted(os.sched_getaffinity(0)),
          "thread_affinities": sorted({tuple(sorted(os.sched_getaffinity(int(t))))
                                       for t in os.listdir("/proc/self/task")}),
          "plan": list(backend.cpu_plan.cores or []),
          "io_threads": len(io_threads),
          "io_idle": all(os.sched_getscheduler(t) == os.SCHED_IDLE for t in io_threads),
          "main_policy": os.sched_getscheduler(0),
          "mpi_yield": os.environ.get("OMPI_MCA_mpi_yield_when_idle")}
with open(os.path.join(sys.argv[3], f"rank{report['rank']}.json"), "w") as f:
    json.dump(report, f)
backend.finish()
"""
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                               reason="binding 2 ranks needs 2 cores this process may use")


def run_probe(tmp_path, launcher: str, builder: str, binding: str) -> dict[int, dict]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    args = [str(script), builder, binding, str(tmp_path)]
    if launcher == "torchrun":
        argv = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(free_port()), *args]
    else:
        argv = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                "-x", "PATH", "-x", "SAGEMAKER_BASE_DIR", "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH",
                PYTHON, *args]
    env = {**job_env(tmp_path), "PYTHONPATH": REPO}
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}


@two_cores
def test_two_ddp_ranks_each_own_a_core_and_gloo_io_thread_is_idle_class(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    reports = run_probe(tmp_path, "torchrun", "train.ddp_train:build_ddp_backend", "auto")
    for rank, report in reports.items():
        assert report["affinity"] == [cores[rank]] == report["plan"]
        assert report["thread_affinities"] == [[cores[rank]]]  # gloo's threads too
        # gloo still names its thread so; if a torch upgrade renames it, this fails instead
        # of the speed-up silently disappearing
        assert report["io_threads"] >= 1 and report["io_idle"]
        assert report["main_policy"] == os.SCHED_OTHER


def test_binding_none_changes_nothing(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    for report in run_probe(tmp_path, "torchrun", "train.ddp_train:build_ddp_backend", "none").values():
        assert report["affinity"] == cores and report["plan"] == []
        assert report["io_threads"] >= 1 and not report["io_idle"]


@two_cores
@needs_mpirun
def test_mpi4py_ranks_under_mpirun_each_own_a_core(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    for rank, report in run_probe(tmp_path, "mpirun", "train.mpi_train:build_mpi_backend", "auto").items():
        assert report["thread_affinities"] == [[cores[rank]]] and report["plan"] == [cores[rank]]
        assert report["mpi_yield"] == "1"  # set before mpi4py.MPI started Open MPI


@pytest.mark.parametrize("environ, device_type, expected", [
    ({}, "cpu", {"OMPI_MCA_mpi_yield_when_idle": "1"}),
    ({"OMPI_MCA_mpi_yield_when_idle": "0"}, "cpu", {}),  # the job's own choice (mpirun -mca sets it so too)
    ({}, "cuda", {}),  # MPI only coordinates there: latency first
])
def test_cpu_ranks_ask_open_mpi_to_yield_while_they_wait(environ, device_type, expected):
    assert decide_mpi_wait_env(environ, device_type) == expected


# GNU OpenMP's spin count before an idle thread sleeps: 300,000 when nothing is set, 0 passive.
@pytest.mark.parametrize("own, expected", [(None, "0"), ("ACTIVE", "30000000000")])
def test_openmp_threads_sleep_when_idle_unless_the_job_says_otherwise(own, expected):
    """The train package sets OMP_WAIT_POLICY before torch loads GNU OpenMP, which prints what
    it read (OMP_DISPLAY_ENV): the setting reaches the library, not only the environment."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update({"OMP_DISPLAY_ENV": "VERBOSE", "PYTHONPATH": REPO, **({"OMP_WAIT_POLICY": own} if own else {})})
    shown = subprocess.run([PYTHON, "-c", "import train.devices, torch; torch.ones(4).sum()"], env=env,
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert f"GOMP_SPINCOUNT = '{expected}'" in shown.stderr


@two_cores
@needs_mpirun
@needs_horovod
def test_horovod_ranks_own_a_core_and_mpi_yields_on_it(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    for rank, report in run_probe(tmp_path, "mpirun", "train.horovod_train:build_horovod_backend", "auto").items():
        # Horovod's background thread is bound with the rank, and Open MPI was told (before
        # hvd.init) to yield instead of spinning on the core the rank computes on.
        assert report["thread_affinities"] == [[cores[rank]]] and report["plan"] == [cores[rank]]
        assert report["mpi_yield"] == "1"

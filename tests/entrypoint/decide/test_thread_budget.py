"""Each process's share of the machine's cores, in the plan (entrypoint/decide/threads.py):
the cores the machine really gives (nproc, affinity, cgroup quota) split among the processes
the launch starts on it, local-mode hosts included; the job's own value wins."""

from __future__ import annotations

import pytest

from entrypoint.decide.threads import CpuFacts, decide_cores, decide_thread_budget
from entrypoint.job.probe import MachineFacts, parse_cfs_quota, parse_cpu_max, probe_cpu_quota
from support.jobs import CPU, make_job, plan_for

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

MPI = {"sagemaker_mpi_enabled": True}
TORCH = {"sagemaker_torch_distributed_enabled": True}
PS = {"sagemaker_parameter_server_enabled": True}
LOCAL = {"current_instance_type": "local"}
INSTANCE = {"current_instance_type": "ml.c5.2xlarge"}  # a real cluster: a machine per host


def cpu(count=8, **kw) -> MachineFacts:
    return MachineFacts(cpu_count=count, gpu_count=kw.pop("gpus", 0), neuron_core_count=0, efa=False,
                        interfaces=("eth0", "lo"), **kw)


def threads_of(plan) -> str | None:
    return plan.env_dict.get("OMP_NUM_THREADS")


def mpi(per_host: int) -> dict:
    return {**MPI, "sagemaker_mpi_num_of_processes_per_host": per_host}


@pytest.mark.parametrize("hps, gpus, expected", [
    ({}, 0, "8"),  # one process: every core
    (mpi(4), 0, "2"),
    (mpi(3), 0, "2"),  # 8 // 3: the remainder left to the launcher and the rest of the machine
    (TORCH, 8, "1"),  # torchrun: a process per GPU
    (TORCH, 9, "1"),  # more processes than cores: still one thread each
    (TORCH, 0, "8"),  # no GPU: one process per host
    (PS, 3, "2"),  # 3 workers and this host's PS shard
])
def test_one_host_splits_its_cores_among_the_processes_its_launcher_starts(hps, gpus, expected):
    plan = plan_for(make_job(hps=hps), cpu(8, gpus=gpus))
    assert threads_of(plan) == expected
    assert "MKL_NUM_THREADS" not in plan.env_dict  # no shared MKL in these facts


@pytest.mark.parametrize("current", ["algo-1", "algo-2"])
def test_mpirun_forwards_the_budget_to_every_rank_on_every_host(current):
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), current=current, hps=mpi(2), resource_extra=INSTANCE))
    assert threads_of(plan) == "4"  # two hosts of their own: each host's 8 cores for its 2 ranks
    if current == "algo-1":
        argv = plan.processes[0].argv
        assert argv[argv.index("OMP_NUM_THREADS") - 1] == "-x"


@pytest.mark.parametrize("hosts, per_host, cores, expected", [
    (2, 1, 2, "1"),  # the main job: 2 containers on a 2-core machine
    (2, 2, 8, "2"),
    (3, 1, 8, "2"),
    (4, 1, 2, "1"),
])
def test_local_mode_counts_every_host_that_shares_the_machine(hosts, per_host, cores, expected):
    names = tuple(f"algo-{i + 1}" for i in range(hosts))
    for current in names:
        plan = plan_for(make_job(hosts=names, current=current, resource_extra=LOCAL,
                                 hps=mpi(per_host)), cpu(cores))
        assert threads_of(plan) == expected
        assert any(f"{hosts} local-mode hosts on this machine" in n for n in plan.notes)


def test_local_gpu_shows_the_gpu_split_and_the_thread_split_together():
    facts = cpu(48, gpus=4)
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), current="algo-2", hps=TORCH,
                             resource_extra={"current_instance_type": "local_gpu"}), facts)
    assert plan.env_dict["CUDA_VISIBLE_DEVICES"] == "2,3" and threads_of(plan) == "12"  # 48 / (2 hosts x 2 GPUs)
    notes = "\n".join(plan.notes)
    assert "algo-2 takes GPU(s) 2,3" in notes and "threads per process: 12" in notes


def test_local_mode_without_a_launcher_counts_one_process_per_host():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), current="algo-2", resource_extra=LOCAL), cpu(8))
    assert threads_of(plan) == "4"


def test_a_real_cluster_counts_only_this_host():
    # (a resource config without current_instance_type is local mode's: the contract's default)
    plan = plan_for(make_job(hosts=("algo-1", "algo-2", "algo-3"), hps=TORCH, resource_extra=INSTANCE), cpu(8))
    assert threads_of(plan) == "8"


@pytest.mark.parametrize("quota, affinity, expected", [
    (1.5, None, 1),  # `docker run --cpus 1.5`: one thread runs unthrottled
    (0.5, None, 1),  # under one core: still one thread
    (4.0, None, 4),
    (7.99, None, 7),  # just under nproc
    (8.0, None, 8),  # at it
    (16.0, None, 8),  # over it: nproc is the limit
    (None, 3, 3),  # a cpuset of 3 cores
    (2.0, 3, 2),
    (None, None, 8),
])
def test_the_cores_are_the_fewest_of_nproc_affinity_and_quota(quota, affinity, expected):
    assert decide_cores(CpuFacts(8, affinity, quota)) == expected
    plan = plan_for(make_job(), cpu(8, cpu_quota=quota, cpu_affinity=affinity))
    assert threads_of(plan) == str(expected)


@pytest.mark.parametrize("processes, expected", [(3, 1), (4, 1), (5, 1), (2, 2), (1, 4)])
def test_processes_just_under_at_and_over_the_cores(processes, expected):
    assert decide_thread_budget({}, CpuFacts(4), processes, 1).threads == expected


@pytest.mark.parametrize("own", [{"OMP_NUM_THREADS": "6"}, {"MKL_NUM_THREADS": "3"},
                                 {"OMP_NUM_THREADS": "6", "MKL_NUM_THREADS": "6"}])
def test_the_jobs_own_value_is_never_overridden(own):
    plan = plan_for(make_job(hps=mpi(4), environ=own),
                    cpu(8, mkl=True))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        assert name not in plan.env_dict  # the ranks inherit the job's value
    argv = plan.processes[0].argv
    for name in own:  # mpirun forwards the job's own value to every rank
        assert argv[argv.index(name) - 1] == "-x"
    note = next(n for n in plan.notes if n.startswith("threads per process"))
    assert "as the job's environment sets them" in note and "the budget would be 2" in note


def test_mkl_gets_the_same_budget_where_the_image_has_it():
    plan = plan_for(make_job(hps=TORCH), cpu(8, mkl=True))  # torchrun without GPUs: 1 process per host
    assert plan.env_dict["OMP_NUM_THREADS"] == plan.env_dict["MKL_NUM_THREADS"] == "8"
    assert any("(OMP_NUM_THREADS and MKL_NUM_THREADS)" in n for n in plan.notes)


def test_hostile_text_in_the_jobs_value_reaches_the_note_as_is():
    hostile = "4\x00\udcff\n"
    plan = plan_for(make_job(environ={"OMP_NUM_THREADS": hostile}), CPU)
    assert "OMP_NUM_THREADS" not in plan.env_dict
    assert any(f"OMP_NUM_THREADS={hostile}" in n for n in plan.notes)


@pytest.mark.parametrize("text, expected", [
    ("max 100000\n", None),
    ("150000 100000\n", 1.5),
    ("200000 100000", 2.0),
    ("0 100000", None),
    ("-1 100000", None),
    ("", None),
    ("max", None),
    ("abc 100000", None),
])
def test_cgroup_v2_cpu_max(text, expected):
    assert parse_cpu_max(text) == expected


def test_cgroup_v1_quota_and_the_probe_read_a_real_tree(tmp_path):
    assert parse_cfs_quota("-1", "100000") is None
    assert parse_cfs_quota("50000\n", "100000\n") == 0.5
    v2 = tmp_path / "v2"
    (v2 / "sys/fs/cgroup").mkdir(parents=True)
    (v2 / "sys/fs/cgroup/cpu.max").write_text("300000 100000\n")
    assert probe_cpu_quota(str(v2)) == 3.0
    v1 = tmp_path / "v1"
    (v1 / "sys/fs/cgroup/cpu").mkdir(parents=True)
    (v1 / "sys/fs/cgroup/cpu/cpu.cfs_quota_us").write_text("250000\n")
    (v1 / "sys/fs/cgroup/cpu/cpu.cfs_period_us").write_text("100000\n")
    assert probe_cpu_quota(str(v1)) == 2.5
    assert probe_cpu_quota(str(tmp_path / "none")) is None

"""Several local-mode hosts on one GPU machine (`instance_type="local_gpu"`, instance_count > 1):
each container sees every GPU, so each host takes its own share (topology.decide_gpu_share):
the same cut on every host, ranks and SM_NUM_GPUS from the share, said in the plan."""

from __future__ import annotations

import json

import pytest

from entrypoint.decide.topology import decide_gpu_share
from entrypoint.errors import JobDefinitionError
from entrypoint.job.probe import MachineFacts
from support.jobs import CPU, GPU4, make_job, plan_for

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

TORCHRUN = {"sagemaker_torch_distributed_enabled": True}
LOCAL_GPU = {"current_instance_type": "local_gpu"}


def plan_on(host: str, hosts=("algo-1", "algo-2"), facts=GPU4, hps=TORCHRUN, environ=None, resource=LOCAL_GPU):
    return plan_for(make_job(hosts=hosts, current=host, hps=hps, resource_extra=resource, environ=environ), facts)


def torchrun_value(plan, option: str) -> str:
    argv = list(plan.processes[0].argv)
    return argv[argv.index(option) + 1]


def test_two_hosts_on_a_four_gpu_machine_take_two_gpus_each_and_start_two_ranks_each():
    one, two = plan_on("algo-1"), plan_on("algo-2")
    assert (one.env_dict["CUDA_VISIBLE_DEVICES"], two.env_dict["CUDA_VISIBLE_DEVICES"]) == ("0,1", "2,3")
    assert one.processes_per_host == two.processes_per_host == 2
    assert torchrun_value(one, "--nproc_per_node") == torchrun_value(two, "--nproc_per_node") == "2"
    assert json.loads(two.env_dict["SM_TRAINING_ENV"])["num_gpus"] == 2 and two.env_dict["SM_NUM_GPUS"] == "2"
    assert any("algo-2 takes GPU(s) 2,3 (CUDA_VISIBLE_DEVICES)" in note for note in two.notes)


def test_every_host_cuts_the_same_list_so_no_gpu_is_in_two_shares():
    hosts = ("algo-1", "algo-2", "algo-3")
    facts = MachineFacts(cpu_count=96, gpu_count=8, neuron_core_count=0, efa=False, interfaces=("eth0", "lo"))
    shares = [plan_on(h, hosts=hosts, facts=facts).env_dict["CUDA_VISIBLE_DEVICES"].split(",") for h in hosts]
    assert shares == [["0", "1"], ["2", "3"], ["4", "5"]]  # 8 // 3 = 2 each; GPUs 6 and 7 unused
    assert any("2 left unused" in note for note in plan_on("algo-1", hosts=hosts, facts=facts).notes)


def test_the_jobs_own_cuda_visible_devices_list_is_the_one_shared():
    two = plan_on("algo-2", environ={"CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b,GPU-c,GPU-d"})
    assert two.env_dict["CUDA_VISIBLE_DEVICES"] == "GPU-c,GPU-d"


@pytest.mark.parametrize("gpus, hosts, per_host", [(2, 2, 1), (3, 2, 1), (4, 4, 1), (5, 4, 1)])
def test_at_and_just_over_one_gpu_per_host(gpus, hosts, per_host):
    names = tuple(f"algo-{i + 1}" for i in range(hosts))
    facts = MachineFacts(cpu_count=8, gpu_count=gpus, neuron_core_count=0, efa=False, interfaces=("eth0",))
    last = plan_on(names[-1], hosts=names, facts=facts)
    assert last.processes_per_host == per_host
    assert last.env_dict["CUDA_VISIBLE_DEVICES"] == str(hosts - 1)


def test_fewer_gpus_than_hosts_is_a_clear_error_naming_the_fix():
    facts = MachineFacts(cpu_count=8, gpu_count=1, neuron_core_count=0, efa=False, interfaces=("eth0",))
    with pytest.raises(JobDefinitionError, match=r'instance_count=1 or fewer with instance_type="local_gpu"'):
        plan_on("algo-2", facts=facts)


@pytest.mark.parametrize("case", ["cloud instance", "one host", "local CPU", "no GPU seen"])
def test_nothing_is_shared_elsewhere(case):
    kwargs = {
        "cloud instance": dict(resource={"current_instance_type": "ml.g5.12xlarge"}),
        "one host": dict(hosts=("algo-1",)),
        "local CPU": dict(resource={"current_instance_type": "local"}),
        "no GPU seen": dict(facts=CPU),
    }[case]
    plan = plan_on(kwargs.pop("hosts", ("algo-1", "algo-2"))[0], **kwargs) if "hosts" not in kwargs else None
    plan = plan or plan_on("algo-1", **kwargs)
    assert "CUDA_VISIBLE_DEVICES" not in plan.env_dict
    assert not any("CUDA_VISIBLE_DEVICES" in note for note in plan.notes)


def test_an_explicit_process_count_over_the_share_is_kept_and_warned():
    hps = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 4}
    plan = plan_on("algo-1", hps=hps)
    assert plan.processes_per_host == 4 and plan.env_dict["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert any("ranks share GPUs" in note for note in plan.notes)


def test_the_share_is_pure_and_the_same_from_either_host():
    job = make_job(hosts=("algo-1", "algo-2"), current="algo-1", resource_extra=LOCAL_GPU)
    assert decide_gpu_share(job, GPU4) == decide_gpu_share(job, GPU4)
    assert decide_gpu_share(job, GPU4)[0] == ("0", "1")


def test_one_local_gpu_host_honours_the_jobs_cuda_visible_devices_as_several_hosts_do():
    """Issue 33, case 8: CUDA_VISIBLE_DEVICES=0,1 on a 4-GPU machine planned 4 processes and
    SM_NUM_GPUS=4 on one host, while the multi-host split took the variable's 2 GPUs."""
    plan = plan_on("algo-1", hosts=("algo-1",), environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert plan.processes_per_host == 2 and torchrun_value(plan, "--nproc_per_node") == "2"
    assert plan.env_dict["SM_NUM_GPUS"] == "2" and plan.env_dict["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert any("CUDA_VISIBLE_DEVICES=0,1: this host uses 2 of the machine's 4 GPU(s)" in n for n in plan.notes)
    two = plan_on("algo-1", environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert (two.processes_per_host, two.env_dict["SM_NUM_GPUS"]) == (1, "1")  # the same list, cut in two


def test_one_local_gpu_host_through_the_real_entrypoints_dry_run(tmp_path):
    """A 4-GPU machine as the entrypoint sees it: nvidia-smi --list-gpus, here a stand-in on PATH."""
    import os

    from support.jobtree import run_entrypoint, write_tree

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n"
                                                               for i in range(4)))
    (tools / "nvidia-smi").chmod(0o755)
    root = write_tree(tmp_path / "ml", script="print('x')\n", resource_extra=LOCAL_GPU, hyperparameters=TORCHRUN)
    done = run_entrypoint(root, "--dry-run", CUDA_VISIBLE_DEVICES="1,3", PATH=f"{tools}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["processes_per_host"] == 2
    assert plan["env"]["SM_NUM_GPUS"] == "2" and plan["env"]["CUDA_VISIBLE_DEVICES"] == "1,3"

"""Every combination of launcher keys x host counts x device kinds gives a plan or a clear
JobDefinitionError that names the key at fault."""

import itertools

import pytest

from entrypoint.errors import JobDefinitionError
from support.jobs import CPU, GPU4, GPU8_EFA, TRN1_EFA, make_job, plan_for

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

DEVICES = {"cpu": (CPU, 1), "gpu4": (GPU4, 4), "gpu8-efa": (GPU8_EFA, 8), "trn1-efa": (TRN1_EFA, 32)}
HOST_COUNTS = (1, 2, 11)
POSITIONS = ("leader", "other")

# launcher keys -> (expected role on the leader, on another host) or the error's key
LAUNCHERS = {
    "none": ({}, ("single", "single")),
    "mpi": ({"sagemaker_mpi_enabled": True}, ("mpi-leader", "mpi-worker")),
    "mpi-disabled": ({"sagemaker_mpi_enabled": False}, ("single", "single")),
    "pytorchddp": ({"sagemaker_pytorch_ddp_enabled": True}, ("mpi-leader", "mpi-worker")),
    "torch_distributed": ({"sagemaker_torch_distributed_enabled": True}, ("torchrun", "torchrun")),
    "smdataparallel": ({"sagemaker_distributed_dataparallel_enabled": True}, ("torchrun", "torchrun")),
    "parameter_server": ({"sagemaker_parameter_server_enabled": True}, ("parameter-server", "parameter-server")),
    "mpi+torch_distributed": (
        {"sagemaker_mpi_enabled": True, "sagemaker_torch_distributed_enabled": True},
        "sagemaker_mpi_enabled and sagemaker_torch_distributed_enabled",
    ),
    "pph-without-mpi": (
        {"sagemaker_torch_distributed_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2},
        "sagemaker_mpi_num_of_processes_per_host",
    ),
    "misspelt-key": ({"sagemaker_mpi_enable": True}, "sagemaker_mpi_enable. Did you mean sagemaker_mpi_enabled?"),
    "not-a-bool": ({"sagemaker_mpi_enabled": "yes"}, "sagemaker_mpi_enabled must be true or false"),
    "bad-pph": ({"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 0}, "sagemaker_mpi_num_of_processes_per_host must be a whole number"),
    "too-many-processes": ({"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_processes": 10_000}, "sagemaker_mpi_num_processes is 10000"),
    "xla-unsupported": ({"sagemaker_pytorch_xla_multi_worker_enabled": True}, "sagemaker_pytorch_xla_multi_worker_enabled"),
    "unknown-group": (
        {"sagemaker_torch_distributed_enabled": True, "sagemaker_distribution_instance_groups": ["nope"]},
        "sagemaker_distribution_instance_groups names nope",
    ),
}
GROUPED = {"unknown-group"}


def cases():
    for (name, (_, expected)), device, n_hosts, position in itertools.product(LAUNCHERS.items(), DEVICES, HOST_COUNTS, POSITIONS):
        if n_hosts == 1 and position == "other":
            continue
        yield pytest.param(name, device, n_hosts, position, id=f"{name}-{device}-{n_hosts}h-{position}")


@pytest.mark.parametrize("name, device, n_hosts, position", list(cases()))
def test_decision_table(name, device, n_hosts, position):
    hps, expected = LAUNCHERS[name]
    hosts = tuple(f"algo-{i}" for i in range(1, n_hosts + 1))
    hosts = tuple(sorted(hosts))  # SageMaker's string order
    current = hosts[0] if position == "leader" else hosts[-1]
    extra = {}
    if name in GROUPED:
        extra = {"current_group_name": "g", "instance_groups": [{"instance_group_name": "g", "instance_type": "ml.x", "hosts": list(hosts)}]}
    facts, device_pph = DEVICES[device]
    job = make_job(hosts=hosts, current=current, hps=hps, resource_extra=extra)
    if isinstance(expected, str):
        with pytest.raises(JobDefinitionError) as info:
            plan_for(job, facts)
        assert expected in str(info.value)
        assert "\n" not in str(info.value).strip()  # one paragraph
        return
    plan = plan_for(job, facts)
    role = expected[0] if position == "leader" else expected[1]
    assert plan.role == role
    assert plan.current_host == current and plan.leader == hosts[0]
    env = dict(plan.env)
    # Every role, launcher or not, gets the DLC's rendezvous variables (leader = first host).
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (hosts[0], "7777")
    if role == "single":
        assert plan.hosts == (current,) and len(plan.processes) == 1
        return
    assert plan.hosts == hosts
    assert plan.processes_per_host == device_pph
    if role == "torchrun":
        argv = plan.processes[0].argv
        assert argv[argv.index("--nproc_per_node") + 1] == str(device_pph)
        if n_hosts > 1:
            assert argv[argv.index("--node_rank") + 1] == str(hosts.index(current))
    if role == "mpi-leader":
        argv = plan.processes[0].argv
        assert argv[argv.index("-np") + 1] == str(n_hosts * device_pph)
    if role == "parameter-server":
        assert len(plan.processes) == 1 + device_pph
    assert ("FI_PROVIDER" in env) == facts.efa
    assert ("PJRT_DEVICE" in env) == bool(facts.neuron_core_count)


@pytest.mark.parametrize("hps,hosts,current,expected", [
    # (is_leader, multi_host, peers): read off the plan, never worked out again by the rooms
    ({"sagemaker_mpi_enabled": True}, ("algo-1", "algo-2", "algo-3"), "algo-1", (True, True, ("algo-2", "algo-3"))),
    ({"sagemaker_mpi_enabled": True}, ("algo-1", "algo-2", "algo-3"), "algo-3", (False, False, ("algo-1",))),  # mpi-worker
    ({"sagemaker_torch_distributed_enabled": True}, ("algo-1", "algo-2"), "algo-2", (False, True, ("algo-1",))),
    ({"sagemaker_torch_distributed_enabled": True}, ("algo-1",), "algo-1", (True, False, ())),
    ({}, ("algo-1", "algo-2"), "algo-2", (False, False, ())),  # no launcher: one process on each host, alone
    ({"sagemaker_parameter_server_enabled": True}, ("algo-2", "algo-10", "algo-1"), "algo-10",
     (False, True, ("algo-2",))),  # SageMaker's order decides the leader
])
def test_the_plan_says_who_leads_and_who_its_peers_are(hps, hosts, current, expected):
    plan = plan_for(make_job(hosts=hosts, current=current, hps=hps))
    assert (plan.is_leader, plan.multi_host, plan.peers) == expected

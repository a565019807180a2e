"""Literal argv for each launcher x cluster shape (RE is this package's record_errors.py)."""

import pytest

from entrypoint.decide.compile_cache import LOCAL_FOLDER

from entrypoint.decide.plan import LAUNCH_TORCHRUN
from entrypoint.decide.plan import RECORD_ERRORS as RE
from entrypoint.run.held import build_held_argv
from support.jobs import CPU, GPU4, GPU8_EFA, PY, TRN1_EFA, make_job, plan_for

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

SCRIPT = "/opt/ml/code/train.py"
FORK = ("--run-path", "--start-method", "fork")  # torchrun forks its ranks (BYOC_FORK_RANKS, on by default)
MPI_FLAGS = (
    "--allow-run-as-root", "--tag-output",
    "-mca", "plm_rsh_agent", "ssh -F /tmp/byoc/ssh/config",
    "-mca", "btl_tcp_if_include", "eth0",
    "-mca", "oob_tcp_if_include", "eth0",
    "-mca", "plm_rsh_no_tree_spawn", "0", "-mca", "routed_radix", "1",
    "-bind-to", "none", "-map-by", "slot",
    "-mca", "pml", "ob1", "-mca", "btl", "^openib,ofi",
    "-mca", "orte_abort_on_non_zero_status", "1",
    "-mca", "btl_vader_single_copy_mechanism", "none",
    "-mca", "odls_base_sigkill_timeout", "1",
)
TORCH = {"sagemaker_torch_distributed_enabled": True}


def non_sm_env(plan):
    """The plan's env but SM_*; the job's key (a hash: tests/entrypoint/hosts/test_job_port.py)
    is shown as what it must be, 64 hex digits, wherever the ranks report to job ports."""
    env = {k: v for k, v in plan.env if not k.startswith("SM_")}
    # Every rank learns where its host's report figures go: the job's runtime folder's report/.
    assert env.pop("BYOC_REPORT_DIR") == plan.report.rank_folder == plan.files.folder + "/report"
    # torch.compile's caches, in the host-local folder by default (test_compile_cache.py).
    assert (env.pop("TORCHINDUCTOR_CACHE_DIR"), env.pop("TRITON_CACHE_DIR")) == (LOCAL_FOLDER, LOCAL_FOLDER + "/triton")
    assert env.pop("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS") == "0"
    key = env.pop("BYOC_JOB_PORT_KEY", None)
    assert env.pop("BYOC_JOB_REPORT_KEY", None) == key  # its old name, for one release
    assert (key is not None) == ("BYOC_JOB_PORTS" in env)
    assert key is None or (len(key) == 64 and int(key, 16) >= 0)
    return env


# What the PyTorch DLC exports for every job, with or without a launcher
# (sagemaker_pytorch_container.training: _set_distributed_environment, _set_nccl_environment).
RENDEZVOUS_ALGO_1 = {"MASTER_ADDR": "algo-1", "MASTER_PORT": "7777", "NCCL_SOCKET_IFNAME": "eth0"}
# Every GPU job: torch's NCCL watchdog fails a rank stuck in a collective, the flight recorder's
# trace goes to the job's output (entrypoint/decide/gpu_env.py).
# Every process's share of the machine's cores (entrypoint/decide/threads.py;
# tests/entrypoint/decide/test_thread_budget.py): OMP_NUM_THREADS = cores // the processes on the
# machine. make_job's resource config names no instance type: local mode's default, in which
# every host of the job shares this one machine, so its processes count too.
def threads(n: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(n)}


NCCL_HANG = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/opt/ml/output/data/nccl_trace_rank_"}


def test_one_host_single_process():
    plan = plan_for(make_job(hps={"epochs": 2, "lr": 0.1}))
    assert plan.role == "single"
    assert [p.argv for p in plan.processes] == [(PY, RE, SCRIPT, "--epochs", "2", "--lr", "0.1")]
    assert non_sm_env(plan) == {**RENDEZVOUS_ALGO_1, **threads(8)}  # alone on CPU's 8 cores


def test_byoc_report_0_leaves_the_report_out_of_the_plan():
    plan = plan_for(make_job(hps={"epochs": 2}, environ={"BYOC_REPORT": "0"}))
    assert plan.report is None and "BYOC_REPORT_DIR" not in dict(plan.env)


@pytest.mark.parametrize("current", ["algo-1", "algo-2"])
def test_two_hosts_without_a_launcher_get_master_addr_and_port_like_the_dlc(current):
    """A script with no distribution= that calls init_process_group("gloo", init_method="env://",
    rank=<host index>, world_size=<hosts>) works on the DLC: every host gets MASTER_ADDR = the
    first host and MASTER_PORT = 7777. No RANK/WORLD_SIZE (the DLC sets neither)."""
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), current=current))
    assert plan.role == "single" and plan.leader == "algo-1"
    assert non_sm_env(plan) == {**RENDEZVOUS_ALGO_1, **threads(4)}  # 2 local-mode hosts, one process each


def test_no_launcher_master_port_setting_and_user_values_win():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), current="algo-2", environ={"BYOC_MASTER_PORT": "29400"}))
    assert non_sm_env(plan) == {**RENDEZVOUS_ALGO_1, "MASTER_PORT": "29400", **threads(4)}
    mine = plan_for(make_job(hosts=("algo-1", "algo-2"), environ={"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "1234"}))
    assert non_sm_env(mine) == {"NCCL_SOCKET_IFNAME": "eth0", **threads(4)}  # the job's own values reach the script as they are


def test_one_host_torchrun_is_standalone_and_forks_its_ranks():
    plan = plan_for(make_job(hps=TORCH), GPU4)
    assert plan.processes[0].argv == (
        PY, LAUNCH_TORCHRUN, "--standalone", "--nnodes", "1",
        "--nproc_per_node", "4", "--max_restarts", "0", *FORK, RE, SCRIPT,
    )


def test_torchrun_without_forked_ranks_starts_each_ranks_interpreter():
    plan = plan_for(make_job(hps=TORCH, environ={"BYOC_FORK_RANKS": "0"}), GPU4)
    assert plan.processes[0].argv == (
        PY, LAUNCH_TORCHRUN, "--standalone", "--nnodes", "1",
        "--nproc_per_node", "4", "--max_restarts", "0", RE, SCRIPT,
    )


@pytest.mark.parametrize("current, node_rank", [("algo-1", "0"), ("algo-2", "1")])
def test_two_hosts_torchrun_same_command_node_rank_from_order(current, node_rank):
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), current=current, hps={**TORCH, "lr": 1}), GPU8_EFA)
    assert plan.role == "torchrun"
    assert plan.processes[0].argv == (
        PY, LAUNCH_TORCHRUN, "--nnodes", "2", "--node_rank", node_rank,
        "--master_addr", "algo-1", "--master_port", "7777", "--rdzv_id", "byoc-attempt-1",
        "--nproc_per_node", "8", "--max_restarts", "0", *FORK, RE, SCRIPT, "--lr", "1",
    )
    assert non_sm_env(plan) == {
        "FI_PROVIDER": "efa", "RDMAV_FORK_SAFE": "1", "FI_EFA_FORK_SAFE": "1",
        "MASTER_ADDR": "algo-1", "MASTER_PORT": "7777", "NCCL_SOCKET_IFNAME": "eth0",
        "BYOC_JOB_PORTS": "algo-1:7778,algo-2:7778", **NCCL_HANG, **threads(6),  # 96 cores, 2 hosts x 8 GPUs
    }


def test_two_hosts_torchrun_with_restarts_keeps_the_static_rendezvous_and_restarts_it_itself():
    """Restarts across hosts are the entrypoint's (roles/attempts.py): torchrun gets no restarts
    of its own and the static rendezvous, attempt 1's id; one host keeps torchrun's own."""
    job = make_job(hosts=("algo-1", "algo-2"), current="algo-2", hps=TORCH, environ={"BYOC_MAX_RESTARTS": "3"})
    plan = plan_for(job, GPU8_EFA)
    assert plan.processes[0].argv == (
        PY, LAUNCH_TORCHRUN, "--nnodes", "2", "--node_rank", "1", "--master_addr", "algo-1", "--master_port", "7777",
        "--rdzv_id", "byoc-attempt-1", "--nproc_per_node", "8", "--max_restarts", "0", *FORK, RE, SCRIPT,
    )
    assert any(n.startswith("BYOC_MAX_RESTARTS=3 on 2 hosts: after a failure the leader restarts torchrun on every "
                            "host, once every host's processes of the failed attempt are gone") for n in plan.notes)
    # The next attempt's torchrun may be started ahead, held (run/held.py): its flag after the launcher.
    assert plan.processes[0].hold_at == 2
    assert build_held_argv(plan.processes[0])[:4] == [PY, LAUNCH_TORCHRUN, "--held", "--nnodes"]
    one_host = plan_for(make_job(hps=TORCH, environ={"BYOC_MAX_RESTARTS": "3"}), GPU8_EFA)
    assert one_host.processes[0].argv[2:5] == ("--standalone", "--nnodes", "1")
    assert one_host.processes[0].hold_at == 0  # torchrun restarts its own ranks: never held
    assert one_host.processes[0].argv[one_host.processes[0].argv.index("--max_restarts") + 1] == "3"
    assert not any(n.startswith("BYOC_MAX_RESTARTS") for n in one_host.notes)


def test_two_hosts_without_efa_gets_no_fi_variables_and_no_ofi_plugin():
    """GPUs and no EFA device (g5, g6, local mode): NCCL's sockets, the aws-ofi-nccl plugin
    never loaded, and the plan says so."""
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), hps=TORCH), GPU4)
    assert non_sm_env(plan) == {"MASTER_ADDR": "algo-1", "MASTER_PORT": "7777", "NCCL_SOCKET_IFNAME": "eth0",
                                "BYOC_JOB_PORTS": "algo-1:7778,algo-2:7778", "NCCL_NET_PLUGIN": "none", **NCCL_HANG,
                                **threads(6)}  # 48 cores, 2 local-mode hosts x 4 GPUs
    assert any(n.startswith("NCCL network: TCP sockets on eth0") for n in plan.notes), plan.notes


def test_user_environment_wins_over_launcher_defaults():
    job = make_job(hosts=("algo-1", "algo-2"), hps=TORCH, environ={"NCCL_SOCKET_IFNAME": "ens5", "FI_PROVIDER": "tcp"})
    env = non_sm_env(plan_for(job, GPU8_EFA))
    assert "NCCL_SOCKET_IFNAME" not in env and "FI_PROVIDER" not in env


ELEVEN = tuple(f"algo-{i}" for i in (1, 10, 11, 2, 3, 4, 5, 6, 7, 8, 9))  # SageMaker's string order


def test_eleven_hosts_keep_sagemaker_order_for_rank_and_leader():
    plan = plan_for(make_job(hosts=ELEVEN, current="algo-2", hps=TORCH), CPU)
    argv = plan.processes[0].argv
    assert argv[2:10] == ("--nnodes", "11", "--node_rank", "3", "--master_addr", "algo-1", "--master_port", "7777")
    assert plan.hosts == ELEVEN


def test_eleven_hosts_mpirun_host_list_in_given_order():
    plan = plan_for(make_job(hosts=ELEVEN, hps={"sagemaker_mpi_enabled": True}), CPU)
    argv = plan.processes[0].argv
    assert argv[:5] == ("mpirun", "--host", ",".join(f"{h}:1" for h in ELEVEN), "-np", "11")


def test_eleven_hosts_mpirun_starts_them_as_a_tree_of_radix_three():
    argv = plan_for(make_job(hosts=ELEVEN, hps={"sagemaker_mpi_enabled": True}), CPU).processes[0].argv
    at = argv.index("plm_rsh_no_tree_spawn")
    assert argv[at:at + 4] == ("plm_rsh_no_tree_spawn", "0", "-mca", "routed_radix")
    assert argv[at + 4] == "3"  # mpirun starts 3 daemons, each of them at most 3 more: 10 workers in two levels


@pytest.mark.parametrize("hosts, radix", [(1, 1), (2, 1), (3, 1), (4, 2), (7, 2), (8, 3), (11, 3), (13, 3), (14, 4),
                                          (32, 6), (64, 8), (256, 16), (257, 16), (258, 16), (274, 17), (1024, 32)])
def test_the_launch_radix_is_the_fewest_that_reach_every_worker_in_two_levels(hosts, radix):
    from entrypoint.decide.launchers.mpirun import decide_launch_radix

    assert decide_launch_radix(hosts) == radix
    workers = hosts - 1
    assert radix + radix * radix >= workers  # two levels: mpirun's own, then each of theirs
    assert radix == 1 or (radix - 1) + (radix - 1) ** 2 < workers  # and no wider than that needs


def test_mpirun_leader_two_hosts_golden():
    job = make_job(
        hosts=("algo-1", "algo-2"),
        hps={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2,
             "sagemaker_mpi_custom_mpi_options": "-x NCCL_DEBUG=INFO --mca btl_tcp_if_exclude lo", "lr": 0.1},
        environ={"PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "do-not-print", "HOME": "/root"},
    )
    plan = plan_for(job, CPU)
    assert plan.role == "mpi-leader"
    sm_names = sorted(k for k, _ in plan.env if k.startswith("SM_"))
    forwarded = sorted(["AWS_SECRET_ACCESS_KEY", "BYOC_ATTEMPT", "BYOC_HOST_ENV_FILE", "BYOC_REPORT_DIR", "MASTER_ADDR", "MASTER_PORT", "NCCL_SOCKET_IFNAME",
                        "OMP_NUM_THREADS", "PATH", "TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS",
                        "TRITON_CACHE_DIR", *sm_names])
    files_flags = ("--allow-run-as-root", "--output-filename", "/tmp/byoc/rank-output:nocopy", *MPI_FLAGS[2:])
    expected = (
        "mpirun", "--host", "algo-1:2,algo-2:2", "-np", "4", *files_flags,
        *[a for name in forwarded for a in ("-x", name)],
        "-x", "NCCL_DEBUG=INFO", "--mca", "btl_tcp_if_exclude", "lo",
        PY, RE, SCRIPT, "--lr", "0.1",
    )
    assert plan.processes[0].argv == expected
    assert not any("do-not-print" in a for a in plan.processes[0].argv)  # names only, never values


@pytest.mark.parametrize("custom, files", [
    ("", True), ("-x NCCL_DEBUG=INFO", True),
    # A user's own output option keeps --tag-output (its files would hold their tags or times).
    ("--output-filename /opt/ml/output/data/logs", False), ("-tag-output", False), ("--timestamp-output", False),
    ("--xml", False), ("--merge-stderr-to-stdout", False), ("-mca orte_tag_output 1", False),
    ("--mca orte_output_filename /tmp/logs", False), ("-mca btl_tcp_if_exclude lo", True),
])
@pytest.mark.parametrize("hosts", [("algo-1",), ("algo-1", "algo-2")])
def test_mpirun_writes_each_ranks_output_to_a_file_the_entrypoint_follows(custom, files, hosts):
    """Issue 33, case 6: each host's daemon writes its ranks' streams to files of their own
    (run/rank_output.py), forwarding nothing to mpirun; a worker's reach the leader over SSH
    (hosts/worker_output.py), so several hosts write them too (the same path on each)."""
    hps = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_custom_mpi_options": custom}
    spec = plan_for(make_job(hosts=hosts, hps=hps), CPU).processes[0]
    folder = "/tmp/byoc/rank-output"
    if files:
        assert spec.argv[5:8] == ("--allow-run-as-root", "--output-filename", f"{folder}:nocopy")
        assert spec.rank_output == folder and "--tag-output" not in spec.argv
    else:
        assert spec.argv[5:7] == ("--allow-run-as-root", "--tag-output") and spec.rank_output == ""


def test_mpirun_worker_runs_no_launcher():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), current="algo-2", hps={"sagemaker_mpi_enabled": True}), CPU)
    assert plan.role == "mpi-worker" and plan.processes == ()


def test_mpi_num_processes_caps_the_total():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_processes": 3}), GPU4)
    assert plan.processes[0].argv[:5] == ("mpirun", "--host", "algo-1:4,algo-2:4", "-np", "3")


def test_pytorchddp_one_rank_per_gpu():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_pytorch_ddp_enabled": True}), GPU4)
    assert plan.processes[0].argv[:5] == ("mpirun", "--host", "algo-1:4,algo-2:4", "-np", "8")


def test_smdataparallel_without_aws_library_falls_back_to_torchrun():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_distributed_dataparallel_enabled": True}), GPU8_EFA)
    assert plan.role == "torchrun" and plan.launcher == "smdataparallel"
    assert plan.processes[0].argv[:2] == (PY, LAUNCH_TORCHRUN)
    assert any("SMDDP library is not in this image" in n for n in plan.notes)


def test_smdataparallel_with_aws_library_uses_smddprun_under_mpirun():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_distributed_dataparallel_enabled": True}),
                    GPU8_EFA._replace(smddprun=True))
    argv = plan.processes[0].argv
    assert argv[:5] == ("mpirun", "--host", "algo-1:8,algo-2:8", "-np", "16")
    assert argv[-4:] == ("smddprun", PY, RE, SCRIPT)


def test_trainium_torchrun_xla_settings_and_parallel_compile():
    job = make_job(hosts=("algo-1", "algo-2"), hps=TORCH, environ={"RUN_NEURON_PARALLEL_COMPILE": "1"})
    plan = plan_for(job, TRN1_EFA)
    assert plan.processes[0].argv == (
        "neuron_parallel_compile", PY, LAUNCH_TORCHRUN, "--nnodes", "2", "--node_rank", "0",
        "--master_addr", "algo-1", "--master_port", "7777", "--rdzv_id", "byoc-attempt-1", "--nproc_per_node", "32",
        "--max_restarts", "0", RE, SCRIPT,
    )
    assert plan.processes[0].hold_at == 0  # neuron_parallel_compile runs the command: never held
    assert non_sm_env(plan) == {
        "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1", "RDMAV_FORK_SAFE": "1",
        "PJRT_DEVICE": "NEURON", "CCOM_SOCKET_IFNAME": "eth0", "NEURON_RT_ROOT_COMM_ID": "algo-1:46820",
        "MASTER_ADDR": "algo-1", "MASTER_PORT": "7777", "NCCL_SOCKET_IFNAME": "eth0",
        "BYOC_JOB_PORTS": "algo-1:7778,algo-2:7778", **threads(2),  # 128 cores, 2 hosts x 32 NeuronCores
    }


def test_parameter_server_processes_on_second_host():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), current="algo-2", hps={"sagemaker_parameter_server_enabled": True}), CPU)
    assert plan.role == "parameter-server"
    assert [(p.name, p.argv, dict(p.env), p.cwd) for p in plan.processes] == [
        ("ps1", (PY, "-m", "train.ps_server"),
         {"WORLD_SIZE": "4", "BYOC_PS_SERVERS": "ps0,ps1", "BYOC_NUM_WORKERS": "2", "RANK": "1", "LOCAL_RANK": "0", "BYOC_PS_ROLE": "server"}, "/"),
        ("worker1", (PY, RE, SCRIPT),
         {"WORLD_SIZE": "4", "BYOC_PS_SERVERS": "ps0,ps1", "BYOC_NUM_WORKERS": "2", "RANK": "3", "LOCAL_RANK": "0",
          "BYOC_PS_ROLE": "worker", "BYOC_WORKER_RANK": "1"}, None),
    ]


HETERO = {
    "current_group_name": "train",
    "instance_groups": [
        {"instance_group_name": "train", "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-2", "algo-3"]},
        {"instance_group_name": "data", "instance_type": "ml.c5.18xlarge", "hosts": ["algo-1"]},
    ],
}


def test_heterogeneous_groups_leader_is_first_distribution_host():
    hps = {**TORCH, "sagemaker_distribution_instance_groups": ["train"]}
    plan = plan_for(make_job(hosts=("algo-1", "algo-2", "algo-3"), current="algo-3", hps=hps, resource_extra=HETERO), GPU8_EFA)
    assert plan.hosts == ("algo-2", "algo-3") and plan.leader == "algo-2"
    assert plan.processes[0].argv[2:10] == ("--nnodes", "2", "--node_rank", "1", "--master_addr", "algo-2", "--master_port", "7777")


def test_heterogeneous_host_outside_distribution_runs_script_once_and_says_so():
    hps = {**TORCH, "sagemaker_distribution_instance_groups": ["train"]}
    extra = {**HETERO, "current_group_name": "data"}
    plan = plan_for(make_job(hosts=("algo-1", "algo-2", "algo-3"), current="algo-1", hps=hps, resource_extra=extra), CPU)
    assert plan.role == "outside-distribution"
    assert [p.argv for p in plan.processes] == [(PY, RE, SCRIPT)]
    assert any("outside the distribution's groups (train)" in n for n in plan.notes)
    # As the DLC: MASTER_ADDR is the first host of the distribution, not the first host.
    assert non_sm_env(plan) == {**RENDEZVOUS_ALGO_1, "MASTER_ADDR": "algo-2", **threads(2)}  # 3 hosts, 1 each


def test_heterogeneous_groups_without_a_launcher_master_is_the_first_host():
    """No distribution key: the toolkit's distribution hosts are empty and its master is hosts[0]."""
    plan = plan_for(make_job(hosts=("algo-1", "algo-2", "algo-3"), current="algo-3", resource_extra=HETERO), CPU)
    assert plan.role == "single"
    assert non_sm_env(plan) == {**RENDEZVOUS_ALGO_1, **threads(2)}


def test_shell_and_package_entry_points():
    from entrypoint.job.program import CodeFacts

    sh = plan_for(make_job(hps={"sagemaker_program": "run.sh", "a": "x"}), CPU, CodeFacts(known=True, program_exists=True))
    assert sh.processes[0].argv == ("/bin/sh", "/opt/ml/code/run.sh", "-a", "x")
    bash = plan_for(make_job(hps={"sagemaker_program": "run.sh"}), CPU,
                    CodeFacts(known=True, program_exists=True, shebang=("/usr/bin/env", "bash")))
    assert bash.processes[0].argv == ("/usr/bin/env", "bash", "/opt/ml/code/run.sh")
    pkg = plan_for(make_job(hps={"sagemaker_program": "trainer/main.py"}), CPU,
                   CodeFacts(known=True, program_exists=True, installable=True, has_requirements=True))
    assert pkg.processes[0].argv == (PY, RE, "-m", "trainer.main")
    assert pkg.install == (
        (PY, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-r", "/opt/ml/code/requirements.txt"),
        (PY, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "/opt/ml/code"),
    )


def test_missing_interface_falls_back_to_eth0():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), hps=TORCH, resource_extra={"network_interface_name": "ethwe"}), CPU)
    assert plan.interface == "eth0" and dict(plan.env)["NCCL_SOCKET_IFNAME"] == "eth0"
    assert dict(plan.env)["SM_NETWORK_INTERFACE_NAME"] == "eth0"
    assert any('"ethwe" does not exist' in n for n in plan.notes)


def test_hostname_shim_preloaded_when_the_container_name_differs():
    facts = GPU4._replace(hostname="ip-10-0-1-23", gethostname_shim="/py/gethostname.so")
    env = non_sm_env(plan_for(make_job(hosts=("algo-1", "algo-2"), hps=TORCH), facts))
    assert env["LD_PRELOAD"] == "/py/gethostname.so"
    same = facts._replace(hostname="algo-1")
    assert "LD_PRELOAD" not in non_sm_env(plan_for(make_job(hosts=("algo-1", "algo-2"), hps=TORCH), same))
    with_user = make_job(hosts=("algo-1", "algo-2"), hps=TORCH, environ={"LD_PRELOAD": "/usr/lib/libjemalloc.so"})
    assert non_sm_env(plan_for(with_user, facts))["LD_PRELOAD"] == "/py/gethostname.so:/usr/lib/libjemalloc.so"


def test_failure_report_names_a_lost_mpi_host():
    from entrypoint.outcome.failure import describe_failure
    from entrypoint.outcome.records import StepEnding

    tail = [
        "ORTE has lost communication with a remote daemon.",
        "  HNP daemon   : [[4242,0],0] on node algo-1",
        "  Remote daemon: [[4242,0],1] on node algo-2",
    ]
    report = describe_failure("mpirun on 2 host(s)", StepEnding(1), None, tail, "algo-1")
    assert report.startswith("Host algo-2 stopped responding")


def test_mpirun_keeps_the_ofi_btl_only_with_efa():
    argv = plan_for(make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_mpi_enabled": True}), GPU8_EFA).processes[0].argv
    assert argv[argv.index("btl") + 1] == "^openib"

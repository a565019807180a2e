"""SDK v3 ModelTrainer jobs through our launcher: reading v3's driver channel
(entrypoint/job/v3_definition.py), the mapping onto our plan (decide/v3_launch.py) and the
fallback to v3's own drivers (cli.start_v3_drivers). Real `python -m entrypoint train` runs on
trees laid out as v3 3.27.0 lays them out; the same jobs under Docker with the real SDK:
tests/localmode/test_v3_jobs.py."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from entrypoint.decide.distribution import decide_v3_distribution, parse_v3_mpi_options, split_process_count_options
from entrypoint.decide.plan import RECORD_ERRORS
from entrypoint.decide.v3_launch import build_v3_args
from entrypoint.errors import JobDefinitionError
from entrypoint.job.v3_definition import (
    V3NotUnderstood,
    build_v3_command,
    decide_v3_route,
    is_legacy_train_command,
    parse_v3_job,
)
from support.jobs import PY as PYTHON
from support.jobtree import failure_text, run_entrypoint, write_tree
from support.ports import decide_master_port

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

# sm_train.sh's last part for each way v3 runs a job (templates.py of sagemaker-train 1.27).
TRAIN_SH = {
    "script": "$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/distributed_drivers/basic_script_driver.py\n",
    "torchrun": "$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/distributed_drivers/torchrun_driver.py\n",
    "mpi": "$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/distributed_drivers/mpi_driver.py\n",
    "command": "CMD=$(cat <<'SAGEMAKER_BASE_COMMAND_EOF'\n{cmd}\nSAGEMAKER_BASE_COMMAND_EOF\n)\neval \"$CMD\"\n",
}
SOURCE = {"source_dir": "/home/me/src", "requirements": None, "entry_script": "train.py", "command": None,
          "args": None, "ignore_patterns": [".env", ".git"]}
HANDED = {"BYOC_SDK_V3_RUN": "byoc"}


def write_v3_tree(root: Path, driver: str, source: dict, distributed: dict, hyperparameters: dict,
                  code: dict[str, str], hosts=("algo-1",), current="algo-1") -> Path:
    channels = {name: {"TrainingInputMode": "File"} for name in ("code", "sm_drivers")}
    write_tree(root, hosts=hosts, current_host=current, channels=channels,
               resource_extra={"network_interface_name": "ethwe", "current_instance_type": "local_cpu"})
    # v3 writes hyperparameters.json itself: each value json.dumps'd, no sagemaker_program
    (root / "input/config/hyperparameters.json").write_text(json.dumps({k: json.dumps(v) for k, v in hyperparameters.items()}))
    drivers = root / "input/data/sm_drivers"
    (drivers / "sourcecode.json").write_text(json.dumps(source))
    (drivers / "distributed.json").write_text(json.dumps(distributed))
    (drivers / "sm_train.sh").write_text("#!/bin/bash\nset -e\n" + TRAIN_SH[driver].format(cmd=source.get("command")))
    for name, text in code.items():
        (root / "input/data/code" / name).write_text(text)
    return root


def plan_of(root: Path, **env: str) -> dict:
    done = run_entrypoint(root, "--dry-run", **{**HANDED, **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# --- reading v3's definition (pure) -------------------------------------------------------


def test_each_driver_is_read_from_sm_train_sh_and_the_two_json_files():
    script = parse_v3_job(SOURCE, {}, TRAIN_SH["script"])
    assert (script.driver, script.entry_script, script.source_dir) == ("script", "train.py", True)
    torchrun = parse_v3_job(SOURCE, {"process_count_per_node": 2, "smp": None}, TRAIN_SH["torchrun"])
    assert (torchrun.driver, torchrun.process_count_per_node) == ("torchrun", 2)
    mpi = parse_v3_job(SOURCE, {"process_count_per_node": None, "mpi_additional_options": ["-x", "A=1"]},
                       TRAIN_SH["mpi"])
    assert (mpi.driver, mpi.process_count_per_node, mpi.mpi_options) == ("mpi", None, ("-x", "A=1"))
    command = parse_v3_job({**SOURCE, "command": "python  run.py", "args": ["a b", 3]}, {"process_count_per_node": 4},
                           TRAIN_SH["command"])
    # v3 ignores distributed for a command, and shell-quotes each arg after the command's words
    assert (command.driver, command.command, command.entry_script) == ("command", "python run.py 'a b' 3", None)


@pytest.mark.parametrize("source, distributed, train_sh, why", [
    ({**SOURCE, "new_field": 1}, {}, TRAIN_SH["script"], "new_field"),
    (SOURCE, {"process_count_per_node": 1, "smp": {"hybrid_shard_degree": 2}}, TRAIN_SH["torchrun"], "smp"),
    (SOURCE, {"process_count_per_node": 1, "future": True}, TRAIN_SH["mpi"], "future"),
    (SOURCE, {}, "echo a driver this image does not know\n", "no driver"),
    (SOURCE, {}, TRAIN_SH["mpi"] + TRAIN_SH["torchrun"], "torchrun and mpi"),
    ({**SOURCE, "source_dir": "s3://b/src.tar.gz"}, {}, TRAIN_SH["script"], ".tar.gz"),
    (SOURCE, {"process_count_per_node": 2.5, "smp": None}, TRAIN_SH["torchrun"], "not a whole number"),
    ({**SOURCE, "command": "python x.py"}, {}, TRAIN_SH["script"], "disagree"),
    ([], {}, TRAIN_SH["script"], "not a JSON object"),
])
def test_what_is_not_understood_says_why(source, distributed, train_sh, why):
    with pytest.raises(V3NotUnderstood, match=why):
        parse_v3_job(source, distributed, train_sh)


def test_only_a_handed_over_job_is_read_and_the_user_may_choose_v3s_drivers():
    assert decide_v3_route({}) is None
    assert decide_v3_route({"BYOC_SDK_V3_RUN": "launched"}) is None  # a nested launcher, a rank's bash
    assert decide_v3_route(HANDED) == "byoc"
    assert decide_v3_route({**HANDED, "BYOC_SDK_V3_DRIVERS": "sdk"}) == "sdk"
    assert is_legacy_train_command(parse_v3_job({**SOURCE, "command": "train"}, {}, TRAIN_SH["command"]))


def test_arguments_are_v3s_own_rendering_in_the_files_order():
    hps = {"zeta": "a b", "a": 1, "lr": 0.5, "flag": True, "layers": [1, 2], "cfg": {"k": None}, "none": None}
    assert build_v3_args(hps) == ("--zeta", "a b", "--a", "1", "--lr", "0.5", "--flag", "true",
                                  "--layers", "[1, 2]", "--cfg", '{"k": null}', "--none", "null")
    assert build_v3_command("torchrun  --nproc_per_node 2 x.py", ["$HOME", "it's"]) == \
        "torchrun --nproc_per_node 2 x.py '$HOME' 'it'\"'\"'s'"


def test_mpirun_options_are_checked_as_ours_are_and_named_as_v3_names_them():
    job = parse_v3_job(SOURCE, {"process_count_per_node": 2, "mpi_additional_options": ["--hostfile", "h"]},
                       TRAIN_SH["mpi"])
    with pytest.raises(JobDefinitionError, match=r"SDK v3's MPI.mpi_additional_options sets --hostfile"):
        decide_v3_distribution(job)


def mpi_job(options, per_host=None):
    return parse_v3_job(SOURCE, {"process_count_per_node": per_host, "mpi_additional_options": options}, TRAIN_SH["mpi"])


@pytest.mark.parametrize("options, rest, counts", [
    (["-np", "4"], (), (("-np", "4"),)),
    # every spelling of mpirun's total count, among other options, each read as mpirun reads it
    (["-x", "A=1", "--np", "4", "--mca", "btl_tcp_if_exclude", "lo", "-n", "4", "-c", "4"],
     ("-x", "A=1", "--mca", "btl_tcp_if_exclude", "lo"), (("--np", "4"), ("-n", "4"), ("-c", "4"))),
    (["-x", "-np"], ("-x", "-np"), ()),  # -x's value, not an option (mpirun reads it so too)
    (["--mca", "np", "-np", "-np", "2"], ("--mca", "np", "-np"), (("-np", "2"),)),  # the MCA value is -np
    (["-x", "A=1", "-np"], ("-x", "A=1"), (("-np", ""),)),  # no value: refused below, not the fallback
    (["-N", "2"], ("-N", "2"), ()),  # per node: not the total
])
def test_v3s_process_count_options_are_taken_out_of_its_mpirun_options(options, rest, counts):
    assert split_process_count_options(tuple(options)) == (tuple(rest), counts)


def test_a_np_is_taken_out_and_the_other_options_reach_mpirun_as_the_toolkits_custom_options_do():
    dist = decide_v3_distribution(mpi_job(["-np", "4", "-x", "A=1", "--mca", "btl_tcp_if_exclude", "lo",
                                           "--NCCL_DEBUG", "INFO"], per_host=2))
    assert dist.np_option == ("-np", 4) and dist.processes_per_host == 2
    assert dist.custom_mpi_options == ("-x", "A=1", "--mca", "btl_tcp_if_exclude", "lo", "-x", "NCCL_DEBUG=INFO")


@pytest.mark.parametrize("options, why", [
    (["-np", "two"], 'has -np "two", which is not a whole number'),
    (["-np", "0"], 'has -np "0", which is not a whole number of at least 1'),
    (["-np", "\u0663"], "which is not a whole number"),  # another script's digit: the one rule
    (["-np", "1_0"], "which is not a whole number"),
    (["-x", "A=1", "-np"], "ends with -np and no number after it"),
    (["-np", "4", "-n", "2"], "sets -np 4 and then -n 2"),
])
def test_a_np_that_is_not_one_count_is_refused_not_given_to_v3s_drivers(options, why):
    job = mpi_job(options)
    parse_v3_mpi_options(job)  # cli.decide_v3_fallback: nothing here for v3's own drivers
    with pytest.raises(JobDefinitionError, match=re.escape(why)):
        decide_v3_distribution(job)


@pytest.mark.parametrize("per_host, ok", [(1, True), (4095, True), (4096, True), (4097, False), (10**29, False),
                                          (-1, False), (0, True)])
def test_process_count_per_node_follows_the_one_rule_for_numbers(per_host, ok):
    for driver, distributed in (("mpi", {"mpi_additional_options": None}), ("torchrun", {"smp": None})):
        job = parse_v3_job(SOURCE, {"process_count_per_node": per_host, **distributed}, TRAIN_SH[driver])
        if ok:
            assert decide_v3_distribution(job).processes_per_host == (per_host or None)
        else:
            with pytest.raises(JobDefinitionError, match=r"process_count_per_node=…\) is .*from 1 to 4096"):
                decide_v3_distribution(job)


# --- the plan (real `python -m entrypoint train --dry-run`) --------------------------------


def test_torchrun_runs_as_our_torchrun_launch_with_v3s_environment(tmp_path):
    root = write_v3_tree(tmp_path, "torchrun", SOURCE, {"process_count_per_node": 2, "smp": None},
                         {"epochs": 3, "my-key": "x"}, {"train.py": "print(1)\n"}, hosts=("algo-1", "algo-2"),
                         current="algo-2")
    plan = plan_of(root)
    assert (plan["role"], plan["launcher"], plan["processes_per_host"]) == ("torchrun", "torch_distributed", 2)
    assert plan["cwd"] == str(root / "input/data/code")
    argv = plan["processes"][0]["argv"]
    assert argv[argv.index("--node_rank") + 1] == "1" and argv[-4:] == ["--epochs", "3", "--my-key", "x"]
    env = plan["env"]
    # The job's BYOC_MASTER_PORT: 7777 but in the suite's parallel workers (support/ports.py).
    assert env["SM_MASTER_ADDR"] == "algo-1" and env["SM_MASTER_PORT"] == str(decide_master_port(os.environ))
    assert (env["SM_HOST_COUNT"], env["SM_CURRENT_HOST_RANK"]) == ("2", "1")
    assert env["SM_HP_MY_KEY"] == "x" and json.loads(env["SM_HPS"]) == {"epochs": 3, "my-key": "x"}
    assert json.loads(env["SM_DISTRIBUTED_CONFIG"]) == {"process_count_per_node": 2, "smp": None}
    assert env["SM_ENTRY_SCRIPT"] == "train.py" and env["BYOC_SDK_V3_RUN"] == "launched"
    assert json.loads(env["SM_TRAINING_ENV"])["master_addr"] == "algo-1"
    assert env["SM_NETWORK_INTERFACE_NAME"] != "ethwe"  # no such interface here


def test_mpi_runs_as_our_mpirun_launch_with_v3s_options_after_ours(tmp_path):
    root = write_v3_tree(tmp_path, "mpi", SOURCE, {"process_count_per_node": 2, "mpi_additional_options": ["-x", "A=1"]},
                         {}, {"train.py": "print(1)\n"}, hosts=("algo-1", "algo-2"))
    plan = plan_of(root)
    argv = plan["processes"][0]["argv"]
    assert plan["role"] == "mpi-leader" and argv[argv.index("-np") + 1] == "4"
    assert argv[argv.index("A=1") - 1] == "-x" and argv.index("A=1") < argv.index(str(root / "input/data/code/train.py"))


def test_a_np_that_agrees_with_the_plan_is_our_mpirun_launch_exactly_as_without_it():
    """v3 3.27's own MPI driver needs mpi_additional_options=["-np", N] (it passes one host's
    count), so v3 users carry it: the argv is the one of the same job without it, v3's other
    options after ours, one -np (the plan's)."""
    from support.jobs import CPU

    options = ["-x", "A=1", "--mca", "btl_tcp_if_exclude", "lo"]
    with_np = mpi_plan("algo-1", CPU, ["-np", "4", *options])
    without = mpi_plan("algo-1", CPU, options)
    argv = with_np.processes[0].argv
    assert argv == without.processes[0].argv
    assert argv[:6] == ("mpirun", "--host", "algo-1:2,algo-2:2", "-np", "4", "--allow-run-as-root")
    assert argv.count("-np") == 1 and "4" not in argv[6:]
    assert argv[-8:] == ("-x", "A=1", "--mca", "btl_tcp_if_exclude", "lo", PYTHON, RECORD_ERRORS, "/opt/ml/code/train.py")


def mpi_plan(current, facts, options, per_host=2):
    from support.jobs import make_job, plan_for

    job = make_job(hosts=("algo-1", "algo-2"), current=current)
    return plan_for(job._replace(sdk_v3=mpi_job(options, per_host), program="train.py",
                                 hyperparameters=job.hyperparameters._replace(values={})), facts)


@pytest.mark.parametrize("distributed, numbers", [
    ({"process_count_per_node": None, "mpi_additional_options": ["-np", "3"]},
     ["sets -np 3, but this job runs 2 processes: 2 host(s) x 1 per host (process_count_per_node unset",
      "remove -np 3 from mpi_additional_options, or make it 2."]),
    ({"process_count_per_node": 2, "mpi_additional_options": ["-x", "A=1", "-n", "2"]},  # v3's own: one host's
     ["sets -n 2, but this job runs 4 processes: 2 host(s) x 2 per host (MPI(process_count_per_node=2))",
      "or make it 4."]),
    ({"process_count_per_node": 1, "mpi_additional_options": ["-np", "3"]},  # just over
     ["sets -np 3, but this job runs 2 processes"]),
    ({"process_count_per_node": 1, "mpi_additional_options": ["-np", "1"]},  # just under
     ["sets -np 1, but this job runs 2 processes"]),
])
def test_a_np_that_disagrees_with_the_plan_is_refused_naming_both_numbers_on_every_host(tmp_path, distributed, numbers):
    marker = tmp_path / "ran"
    for current in ("algo-1", "algo-2"):
        root = write_v3_tree(tmp_path / current, "mpi", SOURCE, distributed, {},
                             {"train.py": f"open({str(marker)!r}, 'w').close()\n"}, hosts=("algo-1", "algo-2"),
                             current=current)
        done = run_entrypoint(root, **HANDED)
        assert done.returncode == 2, done.stderr
        failure = failure_text(root)
        assert failure.startswith("The training job definition is invalid: SDK v3's MPI.mpi_additional_options "), failure
        assert all(n in failure for n in numbers), failure
        assert "SDK v3's own drivers run this job" not in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists()


def test_a_process_count_per_node_past_what_a_host_runs_is_refused_not_planned(tmp_path):
    for per_host, driver, extra in ((10**29, "mpi", {"mpi_additional_options": None}),
                                    (4097, "torchrun", {"smp": None}), (-1, "mpi", {"mpi_additional_options": None})):
        root = write_v3_tree(tmp_path / str(per_host), driver, SOURCE, {"process_count_per_node": per_host, **extra},
                             {}, {"train.py": ""}, hosts=("algo-1", "algo-2"))
        dry = run_entrypoint(root, "--dry-run", **HANDED)
        assert dry.returncode == 2 and dry.stdout == "", dry.stdout[:300]
        assert f"process_count_per_node=…) is \"{per_host}\": it must be a whole number from 1 to 4096" in dry.stderr
        assert "SDK v3's own drivers run this job" not in dry.stderr
    ok = write_v3_tree(tmp_path / "ok", "mpi", SOURCE, {"process_count_per_node": 4096, "mpi_additional_options": None},
                       {}, {"train.py": ""}, hosts=("algo-1", "algo-2"))
    assert plan_of(ok)["processes_per_host"] == 4096  # at the bound


def test_a_nul_in_the_command_is_refused_naming_the_command(tmp_path):
    source = {**SOURCE, "command": "echo before\0after", "entry_script": None}
    root = write_v3_tree(tmp_path, "command", source, {}, {}, {})
    done = run_entrypoint(root, **HANDED)
    assert done.returncode == 2, done.stderr
    failure = failure_text(root)
    assert "SDK v3's SourceCode.command holds a NUL byte (U+0000, character 12 of the command" in failure, failure
    assert "hyperparameter" not in failure and "before" not in done.stdout


def test_a_command_runs_once_per_host_in_bash_and_requirements_install_first(tmp_path):
    source = {**SOURCE, "command": "python run.py", "args": ["--n", 2], "entry_script": None, "requirements": "req.txt"}
    root = write_v3_tree(tmp_path, "command", source, {}, {"ignored": 1}, {"run.py": "", "req.txt": ""})
    plan = plan_of(root)
    assert plan["role"] == "single" and plan["code"]["entry_point"] == "command"
    assert plan["processes"][0]["argv"] == ["/bin/bash", "-e", "-c", "python run.py --n 2"]
    assert plan["install"][0][-2:] == ["-r", str(root / "input/data/code/req.txt")]


# --- real runs ------------------------------------------------------------------------------

SEES = r'''
import json, os, sys
json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "rank": os.environ.get("SM_CURRENT_HOST_RANK"),
           "run": os.environ.get("BYOC_SDK_V3_RUN")}, open(os.path.join(os.environ["SM_MODEL_DIR"], "sees.json"), "w"))
if os.environ.get("SM_HP_FAIL"):
    raise ValueError("deliberate v3 failure")
'''


def test_a_script_sees_what_v3_gives_it_and_its_failure_is_the_jobs(tmp_path):
    root = write_v3_tree(tmp_path / "ok", "script", SOURCE, {}, {"b": "x y", "a": [1]}, {"train.py": SEES})
    done = run_entrypoint(root, **HANDED)
    assert done.returncode == 0, done.stderr
    sees = json.loads((root / "model/sees.json").read_text())
    assert sees == {"argv": ["--b", "x y", "--a", "[1]"], "cwd": str(root / "input/data/code"), "rank": "0",
                    "run": "launched"}
    assert (root / "output/success").exists()
    bad = write_v3_tree(tmp_path / "bad", "script", SOURCE, {}, {"fail": 1}, {"train.py": SEES})
    done = run_entrypoint(bad, **HANDED)
    assert done.returncode == 1
    assert "ValueError: deliberate v3 failure" in (bad / "output/failure").read_text()


def test_a_failing_command_is_the_jobs_failure(tmp_path):
    source = {**SOURCE, "command": "echo first; false; echo never", "entry_script": None}
    root = write_v3_tree(tmp_path, "command", source, {}, {}, {})
    done = run_entrypoint(root, **HANDED)
    assert done.returncode == 1 and "first" in done.stdout + done.stderr and "never" not in done.stdout
    assert (root / "output/failure").exists()


@pytest.mark.parametrize("env, driver, distributed, why", [
    ({"BYOC_SDK_V3_DRIVERS": "sdk"}, "script", {}, "BYOC_SDK_V3_DRIVERS=sdk"),
    ({}, "torchrun", {"process_count_per_node": 1, "smp": {"tensor_parallel_degree": 2}}, "smp"),
    ({}, "mpi", {"process_count_per_node": 1, "mpi_additional_options": ["--hostfile", "h"]}, "--hostfile"),
])
def test_the_fallback_runs_v3s_own_command_again_with_one_line_why(tmp_path, env, driver, distributed, why):
    root = write_v3_tree(tmp_path, driver, SOURCE, distributed, {}, {"train.py": ""})
    done = run_entrypoint(root, **HANDED, **env, BYOC_SDK_V3_COMMAND='echo "v3 drivers ran: $BYOC_SDK_V3_RUN"')
    assert done.returncode == 0, done.stderr
    assert done.stdout == "v3 drivers ran: sdk\n"
    lines = [line for line in done.stderr.splitlines() if "SDK v3's own drivers run this job" in line]
    assert len(lines) == 1 and why in lines[0]
    assert not (root / "output/failure").exists()


# --- the launcher's features, the same for a v3 job (pure plans) ---------------------------


def v3_plan(current: str, facts, hosts=("algo-1", "algo-2"), resource=None, checkpoint=None):
    from support.jobs import make_job, plan_for

    v3 = parse_v3_job(SOURCE, {"process_count_per_node": None, "smp": None}, TRAIN_SH["torchrun"])
    job = make_job(hosts=hosts, current=current, resource_extra=resource, checkpoint=checkpoint)
    return plan_for(job._replace(sdk_v3=v3, program="train.py", hyperparameters=job.hyperparameters._replace(values={})),
                    facts)


def test_local_gpu_hosts_on_one_machine_take_their_own_share():
    from support.jobs import GPU4

    one, two = (v3_plan(h, GPU4, resource={"current_instance_type": "local_gpu"}) for h in ("algo-1", "algo-2"))
    assert (one.env_dict["CUDA_VISIBLE_DEVICES"], two.env_dict["CUDA_VISIBLE_DEVICES"]) == ("0,1", "2,3")
    assert one.processes_per_host == two.processes_per_host == 2  # v3 alone: 4 each, on the same GPUs


def test_the_neuron_cache_goes_in_the_checkpoint_folder():
    from entrypoint.job.config import CheckpointConfig
    from support.jobs import TRN1_EFA

    plan = v3_plan("algo-1", TRN1_EFA, checkpoint=CheckpointConfig("/opt/ml/checkpoints", "s3://b/c"))
    assert plan.env_dict["NEURON_COMPILE_CACHE_URL"] == "/opt/ml/checkpoints/neuron-compile-cache"
    assert plan.processes_per_host == 32 and "NCCL_PROTO" not in plan.env_dict


def test_on_sagemaker_every_instance_group_takes_part_as_under_v3s_drivers():
    from support.jobs import CPU

    groups = {"instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": "ml.c5.xlarge",
                                   "hosts": ["algo-1", "algo-2"]}], "current_group_name": "homogeneousCluster"}
    plan = v3_plan("algo-2", CPU, resource=groups)
    assert (plan.role, plan.hosts) == ("torchrun", ("algo-1", "algo-2"))

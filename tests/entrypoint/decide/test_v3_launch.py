"""SDK v3 ModelTrainer jobs through our launcher: reading v3's driver channel
(entrypoint/job/v3_definition.py), the mapping onto our plan (decide/v3_launch.py) and the
fallback to v3's own drivers (cli.start_v3_drivers). Real `python -m entrypoint train` runs on
trees laid out as v3 3.27.0 lays them out; the same jobs under Docker with the real SDK:
tests/localmode/test_v3_jobs.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrypoint.decide.distribution import decide_v3_distribution
from entrypoint.decide.v3_launch import build_v3_args
from entrypoint.errors import JobDefinitionError
from entrypoint.job.v3_definition import (
    V3NotUnderstood,
    build_v3_command,
    decide_v3_route,
    is_legacy_train_command,
    parse_v3_job,
)
from support.jobtree import run_entrypoint, write_tree

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
    (SOURCE, {"process_count_per_node": -1, "smp": None}, TRAIN_SH["torchrun"], "at least 1"),
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
    job = parse_v3_job(SOURCE, {"process_count_per_node": 2, "mpi_additional_options": ["-np", "8"]}, TRAIN_SH["mpi"])
    with pytest.raises(JobDefinitionError, match=r"SDK v3's MPI.mpi_additional_options sets -np"):
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
    assert env["SM_MASTER_ADDR"] == "algo-1" and env["SM_MASTER_PORT"] == "7777"
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

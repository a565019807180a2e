"""An SDK v3 `ModelTrainer` job (job/v3_definition.py) mapped onto our plan (pure).

What a v3 user's script sees stays what v3's own drivers give it (sagemaker-train 1.27,
container_drivers/):
- the distribution (distribution.decide_v3_distribution, beside the keys it stands for):
  Torchrun() is our torchrun launch, MPI() our mpirun launch (its mpi_additional_options after
  ours, checked as sagemaker_mpi_custom_mpi_options are; a `-np N` there, which v3 3.27's own
  driver needs, must be the plan's hosts x processes per host: check_v3_process_count), no
  `distributed` and `command=` one process on each host, as v3 runs them;
- the arguments: every hyperparameter as `--key value`, in hyperparameters.json's order,
  strings as they are and other values as json.dumps writes them (common/utils.py,
  hyperparameters_to_cli_args); none for `command=` (v3 passes SourceCode.args in the command);
- the program: `.py` with python (under our rank wrapper), `.sh` with its interpreter line,
  `command=` with bash -e (sm_train.sh's `set -e` and `eval`); in the code channel when there is
  a source_dir; `requirements` installed there first; no setup.py install (v3 does none);
- the environment: ours (the toolkit's SM_*) plus what v3's scripts/environment.py exports,
  v3's values winning where both define a name: SM_MASTER_ADDR/PORT, SM_HOST_COUNT,
  SM_CURRENT_HOST_RANK, SM_SOURCE_DIR, SM_ENTRY_SCRIPT, SM_DISTRIBUTED_CONFIG, SM_HPS with
  every key, SM_HP_<KEY> with '-' as '_', SM_TRAINING_ENV with v3's keys added.
Deliberately not v3's: NCCL_PROTO=simple (the job's or NCCL's own choice), SM_NETWORK_INTERFACE_NAME
"ethwe" where no such interface exists, -np of one host under MPI (v3's bug).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from entrypoint.decide.topology import Topology
from entrypoint.errors import JobDefinitionError
from entrypoint.job.config import JobConfig
from entrypoint.job.program import CodeFacts, EntryPoint, build_program_argv, decide_entry_point
from entrypoint.job.v3_definition import LAUNCHED, RUN_ENV, V3Job

def render_v3_value(value: Any) -> str:
    """common/utils.safe_serialize: a string as it is, anything else json.dumps' default text."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def build_v3_args(hyperparameters: Mapping[str, Any]) -> tuple[str, ...]:
    """hyperparameters_to_cli_args: `--key value` for every hyperparameter, in the file's order."""
    args: list[str] = []
    for key, value in hyperparameters.items():
        args += [f"--{key}", render_v3_value(value)]
    return tuple(args)


def check_v3_process_count(np_option: tuple[str, int] | None, per_host_set: bool, topo: Topology) -> None:
    """SDK v3's `-np N` (MPI.mpi_additional_options) agrees with the plan, or the job is refused
    naming both numbers: this image starts hosts x processes per host itself, and would
    neither run another count behind the user's back nor hand the job to v3's drivers."""
    if np_option is None or np_option[1] == topo.world_size:
        return
    option, asked = np_option
    hosts = len(topo.distribution_hosts)
    per_host = (f"MPI(process_count_per_node={topo.processes_per_host})" if per_host_set
                else "process_count_per_node unset: one per GPU or NeuronCore, one on a CPU host")
    raise JobDefinitionError(
        f"SDK v3's MPI.mpi_additional_options sets {option} {asked}, but this job runs {topo.world_size} "
        f"processes: {hosts} host(s) x {topo.processes_per_host} per host ({per_host}). This image starts every "
        f"host's processes itself: remove {option} {asked} from mpi_additional_options, or make it "
        f"{topo.world_size}.")


def build_v3_install_steps(python: str, code_dir: str, v3: V3Job) -> tuple[tuple[str, ...], ...]:
    """SourceCode.requirements: a file relative to the code folder, installed before the run."""
    if not v3.requirements:
        return ()
    return ((python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-r",
             os.path.join(code_dir, v3.requirements)),)


def check_v3_command(command: str) -> str:
    """SourceCode.command (with SourceCode.args after it) as bash can be given it: a NUL ends an
    argument for the kernel, so the job is refused naming the command, not a hyperparameter."""
    if "\0" in command:
        raise JobDefinitionError(
            f"SDK v3's SourceCode.command holds a NUL byte (U+0000, character {command.index(chr(0)) + 1} of the "
            f"command with SourceCode.args after it), which no program can be given as an argument: remove it "
            f"from SourceCode.command (or SourceCode.args).")
    return command


def decide_v3_program(job: JobConfig, code_facts: CodeFacts, python: str,
                      record_errors: str) -> tuple[EntryPoint, tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """(entry point, one process's argv, install steps) of a v3 job."""
    v3: V3Job = job.sdk_v3
    code_dir = job.paths.code_dir
    install = build_v3_install_steps(python, code_dir, v3)
    if v3.driver == "command":
        command = check_v3_command(v3.command or "")
        return EntryPoint("command", command, code_dir), ("/bin/bash", "-e", "-c", command), install
    facts = code_facts._replace(installable=False, has_requirements=False)
    entry = decide_entry_point(v3.entry_script or "", code_dir, facts)
    return entry, build_program_argv(entry, python, facts, build_v3_args(job.hyperparameters.values),
                                     record_errors), install


def build_v3_env(job: JobConfig, topo: Topology, sm_env: Mapping[str, str], master_port: int) -> dict[str, str]:
    """What v3's scripts/environment.py adds to, or says differently from, our SM_* (sm_env),
    and the mark that keeps the job from being handed over again."""
    v3: V3Job = job.sdk_v3
    paths = job.paths
    hosts = sorted(job.resource.hosts)
    hps = dict(job.hyperparameters.values)
    env: dict[str, Any] = {
        "SM_INPUT_DATA_DIR": paths.input_data_dir,
        "SM_OUTPUT_FAILURE": paths.failure_file,
        "SM_MASTER_ADDR": topo.leader,
        "SM_MASTER_PORT": master_port,
        "SM_SOURCE_DIR": paths.channel_dir("code"),
        "SM_ENTRY_SCRIPT": v3.entry_script or "",
        "SM_CHANNELS": list(job.input_data.names),
        "SM_HPS": hps,
        "SM_HOSTS": hosts,
        "SM_HOST_COUNT": len(hosts),
        "SM_CURRENT_HOST_RANK": hosts.index(job.resource.current_host),
    }
    if v3.definition:
        env["SM_DISTRIBUTED_DRIVER_DIR"] = os.path.join(paths.channel_dir("sm_drivers"), "distributed_drivers")
        env["SM_DISTRIBUTED_CONFIG"] = dict(v3.definition)
    for key, value in hps.items():
        env[f"SM_HP_{key.replace('-', '_').upper()}"] = value
    training_env = json.loads(sm_env.get("SM_TRAINING_ENV", "{}"))
    training_env.update({"hosts": hosts, "master_addr": topo.leader, "master_port": master_port,
                         "hyperparameters": hps, "input_data_dir": paths.input_data_dir})
    env["SM_TRAINING_ENV"] = training_env
    out = {k: render_v3_value(v) for k, v in env.items()}
    out[RUN_ENV] = LAUNCHED
    return out

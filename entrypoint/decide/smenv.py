"""The SM_* environment the user's script sees: the sagemaker-training toolkit's, computed
from our frozen config (pure).

Parity with `sagemaker_training.environment.Environment().to_env_vars()` is tested against the
installed toolkit. Deliberate differences (README, "Differences from the toolkit"):
  - SM_USER_ARGS (and the script's argv): non-string hyperparameter values are
    passed as JSON (`["a","b"]`, `true`, `{"k":1}`, `null`), not Python's str() (`['a', 'b']`,
    `True`, `k=1`, ``). SM_HP_<NAME> were already JSON, so the two now agree.
  - SM_NETWORK_INTERFACE_NAME (and network_interface_name in SM_TRAINING_ENV) is the
    interface that exists on this host: a configured "ethwe" that does not exist becomes eth0.
"""

from __future__ import annotations

from typing import Any, Mapping

from entrypoint.job.config import JobConfig
from entrypoint.job.json_text import build_json, canonical_json
from entrypoint.job.probe import MachineFacts
from entrypoint.decide.topology import Topology

# logging.INFO: the toolkit's default SM_LOG_LEVEL; logging itself is not imported for one number.
LOG_LEVEL_INFO = 20


def render_env_value(value: Any) -> str:
    """The toolkit's rule: strings as they are, None as "", anything else compact sorted JSON."""
    if isinstance(value, bytes):
        return value.decode("latin1")
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return canonical_json(value)


def render_arg_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    # Not ASCII-escaped: a unicode value in a list reaches the script as the user wrote it.
    return build_json(value, separators=(",", ":"), ensure_ascii=False)


def build_user_args(user_hyperparameters: Mapping[str, Any]) -> tuple[str, ...]:
    """`--key value` for each user hyperparameter, keys sorted (`-k` for one-letter keys)."""
    args: list[str] = []
    for key in sorted(user_hyperparameters):
        args.append(f"-{key}" if len(key) == 1 else f"--{key}")
        args.append(render_arg_value(user_hyperparameters[key]))
    return tuple(args)


def module_name_of(program: str | None) -> str:
    name = str(program)  # the toolkit's str(None) == "None" when no program is named
    return name[:-3] if name.endswith(".py") else name


def build_training_env(job: JobConfig, facts: MachineFacts, topo: Topology) -> dict[str, Any]:
    """The toolkit's `dict(Environment())`: every public property, by name. The hosts, groups
    and leader are the job's one topology (topology.decide_topology)."""
    environ = job.environ
    paths = job.paths
    hps = job.hyperparameters
    sagemaker = hps.sagemaker
    resource = job.resource
    mp_parameters = environ.get("SM_HP_MP_PARAMETERS")
    groups = resource.raw.get("instance_groups") or []
    return {
        "additional_framework_parameters": dict(hps.framework),
        "channel_input_dirs": {c: paths.channel_dir(c) for c in job.input_data.names},
        "current_host": topo.current_host,
        "current_instance_group": resource.current_group_name,
        "current_instance_group_hosts": list(topo.current_group_hosts),
        "current_instance_type": resource.current_instance_type,
        "distribution_hosts": list(topo.distribution_hosts),
        "distribution_instance_groups": list(topo.distribution_groups),
        "framework_module": environ.get("SAGEMAKER_TRAINING_MODULE"),
        "hosts": list(topo.hosts),
        "hyperparameters": dict(hps.user),
        "input_config_dir": paths.input_config_dir,
        "input_data_config": dict(job.input_data.raw),
        "input_dir": paths.input_dir,
        "instance_groups": [g["instance_group_name"] for g in groups],
        "instance_groups_dict": {g["instance_group_name"]: g for g in groups},
        "is_hetero": len(groups) > 1,
        "is_master": topo.is_leader,
        # The toolkit computes `mp and mp != "{}"`: None when unset, "" when empty.
        "is_modelparallel_enabled": mp_parameters and mp_parameters != "{}",
        "is_smddpmprun_installed": facts.smddpmprun,
        "is_smddprun_installed": facts.smddprun,
        "job_name": environ.get("TRAINING_JOB_NAME"),
        "log_level": sagemaker.get("sagemaker_container_log_level", LOG_LEVEL_INFO),
        "master_hostname": topo.leader,
        "model_dir": paths.model_dir,
        "module_dir": str(sagemaker.get("sagemaker_submit_directory", paths.code_dir)),
        "module_name": module_name_of(job.program),
        "network_interface_name": topo.interface,
        "num_cpus": facts.cpu_count,
        "num_gpus": len(topo.gpu_share) if topo.gpu_share is not None else facts.gpu_count,
        "num_neurons": facts.neuron_core_count,
        "output_data_dir": paths.output_data_dir,
        "output_dir": paths.output_dir,
        "output_intermediate_dir": paths.output_intermediate_dir,
        "resource_config": dict(resource.raw),
        "topology": resource.raw.get("topology", []),
        "user_entry_point": job.program,
    }


def build_sm_env(job: JobConfig, facts: MachineFacts, topo: Topology) -> dict[str, str]:
    training_env = build_training_env(job, facts, topo)
    user_args = list(build_user_args(job.hyperparameters.user))
    env: dict[str, Any] = {
        "hosts": training_env["hosts"],
        "network_interface_name": topo.interface,
        "hps": training_env["hyperparameters"],
        "user_entry_point": training_env["user_entry_point"],
        "framework_params": training_env["additional_framework_parameters"],
        "resource_config": training_env["resource_config"],
        "input_data_config": training_env["input_data_config"],
        "output_data_dir": training_env["output_data_dir"],
        "channels": sorted(training_env["channel_input_dirs"]),
        "current_host": training_env["current_host"],
        "current_instance_type": training_env["current_instance_type"],
        "current_instance_group": training_env["current_instance_group"],
        "current_instance_group_hosts": training_env["current_instance_group_hosts"],
        "instance_groups": training_env["instance_groups"],
        "instance_groups_dict": training_env["instance_groups_dict"],
        "distribution_instance_groups": training_env["distribution_instance_groups"],
        "is_hetero": training_env["is_hetero"],
        "module_name": training_env["module_name"],
        "log_level": training_env["log_level"],
        "framework_module": training_env["framework_module"],
        "input_dir": training_env["input_dir"],
        "input_config_dir": training_env["input_config_dir"],
        "output_dir": training_env["output_dir"],
        "num_cpus": training_env["num_cpus"],
        "num_gpus": training_env["num_gpus"],
        "num_neurons": training_env["num_neurons"],
        "model_dir": training_env["model_dir"],
        "module_dir": training_env["module_dir"],
        "training_env": training_env,
        "user_args": user_args,
        "output_intermediate_dir": training_env["output_intermediate_dir"],
    }
    if training_env["topology"]:
        env["topology"] = training_env["topology"]
    for name, path in training_env["channel_input_dirs"].items():
        env[f"channel_{name}"] = path
    for key, value in training_env["hyperparameters"].items():
        env[f"hp_{key}"] = value
    return {f"SM_{str(k).upper()}": render_env_value(v) for k, v in env.items()}

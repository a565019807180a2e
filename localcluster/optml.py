"""What each emulated host finds under /opt/ml, as SageMaker local mode (SDK v2) lays it out (pure).

Per host: input/ (config files naming this host) and output/. Shared by all hosts: model/,
each channel's data folder, code/ (and shared/ when code is local, as the SDK mounts it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

HOMOGENEOUS_GROUP = "homogeneousCluster"
LOCAL_INSTANCE_TYPE = "local"
INTERFACE_NAME = "eth0"
CONTAINER_LOG_LEVEL = 20  # logging.INFO, what the SDK writes by default
OPT_ML = "/opt/ml"
ROOT_BASHRC = "/root/.bashrc"

DISTRIBUTIONS = ("none", "mpi", "torch_distributed", "pytorchddp", "parameter_server")


@dataclass(frozen=True)
class Channel:
    name: str
    source: str | None = None  # a folder on this machine; None: an empty folder of our own
    content_type: str | None = None


@dataclass(frozen=True)
class InstanceGroupSpec:
    name: str
    count: int
    instance_type: str = LOCAL_INSTANCE_TYPE


@dataclass(frozen=True)
class InstanceGroup:
    name: str
    instance_type: str
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class JobSpec:
    """What a user hands the SDK's estimator, reduced to what ends up in /opt/ml."""

    job_name: str = "localcluster-job"
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)  # values as the user wrote them
    program: str | None = None  # sagemaker_program
    code_dir: str | None = None  # mounted at /opt/ml/code
    channels: tuple[Channel, ...] = ()
    distribution: str = "none"
    processes_per_host: int | None = None
    custom_mpi_options: str = ""
    instance_groups: tuple[InstanceGroupSpec, ...] = ()  # empty: one homogeneous group
    distribution_instance_groups: tuple[str, ...] = ()
    instance_type: str = LOCAL_INSTANCE_TYPE  # for hosts outside explicit groups
    region: str | None = None  # sagemaker_region / AWS_REGION when given


@dataclass(frozen=True)
class Mount:
    source: str  # a path on this machine
    target: str  # the path inside the host's mount namespace
    is_dir: bool = True


@dataclass(frozen=True)
class WorkdirLayout:
    """Where a cluster's files live on this machine."""

    root: str

    @property
    def shared_model(self) -> str:
        return os.path.join(self.root, "shared", "model")

    @property
    def shared_shared(self) -> str:
        return os.path.join(self.root, "shared", "shared")

    def shared_channel(self, channel: str) -> str:
        return os.path.join(self.root, "shared", "data", channel)

    def host_dir(self, host: str) -> str:
        return os.path.join(self.root, "hosts", host)

    def opt_ml(self, host: str) -> str:
        """The host's /opt/ml as seen from outside (shared folders appear empty here: they are
        bind-mounted only inside the host's mount namespace)."""
        return os.path.join(self.host_dir(host), "opt-ml")

    def private(self, host: str, name: str) -> str:
        return os.path.join(self.host_dir(host), "private", name)

    @property
    def logs(self) -> str:
        return os.path.join(self.root, "logs")

    def log(self, host: str) -> str:
        return os.path.join(self.logs, f"{host}.log")


# ---------------------------------------------------------------- parsing user input


def parse_hyperparameter_value(text: str) -> Any:
    """`3` -> 3, `true` -> True, `[1, 2]` -> [1, 2], `"3"` -> "3", `abc` -> "abc": JSON when the
    text is JSON, else the string itself (what a user typing `--hp lr=0.1` means)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_assignment(text: str, what: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{what} must look like NAME=VALUE, got {text!r}")
    return key, value


def parse_hyperparameter_assignments(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for item in items:
        key, value = parse_assignment(item, "--hp")
        result[key] = parse_hyperparameter_value(value)
    return result


def parse_hyperparameters_json(text: str, source: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{source}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object of hyperparameters, got {type(data).__name__}")
    return data


def parse_channel_assignments(items: list[str] | tuple[str, ...]) -> tuple[Channel, ...]:
    channels: list[Channel] = []
    for item in items:
        name, path = parse_assignment(item, "--channel")
        channels.append(Channel(name=name, source=path))
    validate_channels(tuple(channels))
    return tuple(channels)


def validate_channels(channels: tuple[Channel, ...]) -> None:
    seen: set[str] = set()
    for c in channels:
        if not c.name or "/" in c.name or c.name in (".", ".."):
            raise ValueError(f"invalid channel name {c.name!r}")
        if c.name in seen:
            raise ValueError(f"channel {c.name!r} given twice")
        seen.add(c.name)


def parse_instance_groups_spec(text: str) -> tuple[InstanceGroupSpec, ...]:
    """`train:2:ml.p4d.24xlarge,data:1` -> groups in order; hosts are handed out in creation
    order (the first 2 hosts form `train`, the next one `data`)."""
    groups: list[InstanceGroupSpec] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        fields = part.split(":")
        if len(fields) not in (2, 3) or not fields[0]:
            raise ValueError(f"instance group {part!r} must look like NAME:COUNT[:INSTANCE_TYPE]")
        try:
            count = int(fields[1])
        except ValueError:
            raise ValueError(f"instance group {part!r}: COUNT must be a number") from None
        if count < 1:
            raise ValueError(f"instance group {part!r}: COUNT must be at least 1")
        groups.append(InstanceGroupSpec(fields[0], count, fields[2] if len(fields) == 3 else LOCAL_INSTANCE_TYPE))
    if not groups:
        raise ValueError("--instance-groups is empty")
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        raise ValueError(f"instance group names must be unique, got {names}")
    return tuple(groups)


# ---------------------------------------------------------------- deciding file contents


def build_instance_groups(job: JobSpec, host_names: tuple[str, ...]) -> tuple[InstanceGroup, ...]:
    """Instance groups with their hosts. `host_names` in creation order; within a group the
    hosts are listed sorted as strings, like `hosts`."""
    if not job.instance_groups:
        return (InstanceGroup(HOMOGENEOUS_GROUP, job.instance_type, tuple(sorted(host_names))),)
    wanted = sum(g.count for g in job.instance_groups)
    if wanted != len(host_names):
        raise ValueError(f"instance groups add up to {wanted} hosts but the cluster has {len(host_names)}")
    groups = []
    start = 0
    for spec in job.instance_groups:
        members = host_names[start : start + spec.count]
        start += spec.count
        groups.append(InstanceGroup(spec.name, spec.instance_type, tuple(sorted(members))))
    return tuple(groups)


def build_resource_config(current_host: str, host_names: tuple[str, ...], groups: tuple[InstanceGroup, ...]) -> dict:
    own = next(g for g in groups if current_host in g.hosts)
    return {
        "current_host": current_host,
        "current_instance_type": own.instance_type,
        "current_group_name": own.name,
        "hosts": sorted(host_names),
        "instance_groups": [
            {"instance_group_name": g.name, "instance_type": g.instance_type, "hosts": list(g.hosts)}
            for g in groups
        ],
        "network_interface_name": INTERFACE_NAME,
    }


def build_distribution_hyperparameters(job: JobSpec) -> dict[str, Any]:
    """The keys the SDK's framework estimators add for `distribution=` (values not yet encoded)."""
    if job.distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {job.distribution!r}; choose one of {', '.join(DISTRIBUTIONS)}")
    if job.processes_per_host is not None:
        if job.distribution != "mpi":
            raise ValueError(
                "--processes-per-host is written as sagemaker_mpi_num_of_processes_per_host and "
                f"only means something with --distribution mpi (got {job.distribution!r}); the "
                "toolkits derive it from the device count for the other launchers"
            )
        if job.processes_per_host < 1:
            raise ValueError(f"--processes-per-host must be at least 1, got {job.processes_per_host}")
    hps: dict[str, Any] = {}
    if job.distribution == "mpi":
        hps["sagemaker_mpi_enabled"] = True
        if job.processes_per_host is not None:
            hps["sagemaker_mpi_num_of_processes_per_host"] = job.processes_per_host
        hps["sagemaker_mpi_custom_mpi_options"] = job.custom_mpi_options
    elif job.distribution == "torch_distributed":
        hps["sagemaker_torch_distributed_enabled"] = True
        hps["sagemaker_instance_type"] = job.instance_type
    elif job.distribution == "pytorchddp":
        hps["sagemaker_pytorch_ddp_enabled"] = True
        hps["sagemaker_instance_type"] = job.instance_type
    elif job.distribution == "parameter_server":
        hps["sagemaker_parameter_server_enabled"] = True
    if job.distribution_instance_groups:
        hps["sagemaker_distribution_instance_groups"] = list(job.distribution_instance_groups)
    return hps


def build_hyperparameters(job: JobSpec) -> dict[str, str]:
    """hyperparameters.json: every value JSON-encoded, as SDK >= 2.110 does (`"\\"train.py\\""`).
    User values win over the keys the SDK would add, as when a user sets them by hand."""
    raw: dict[str, Any] = {}
    if job.program is not None:
        raw["sagemaker_program"] = job.program
    if job.code_dir is not None:
        # Local mode rewrites file:// source dirs to the mounted path.
        raw["sagemaker_submit_directory"] = f"{OPT_ML}/code"
    raw["sagemaker_container_log_level"] = CONTAINER_LOG_LEVEL
    raw["sagemaker_job_name"] = job.job_name
    if job.region is not None:
        raw["sagemaker_region"] = job.region
    raw.update(build_distribution_hyperparameters(job))
    raw.update(job.hyperparameters)
    return {str(k): json.dumps(v) for k, v in raw.items()}


def build_input_data_config(channels: tuple[Channel, ...]) -> dict:
    """inputdataconfig.json as local mode writes it: TrainingInputMode File (+ ContentType)."""
    config: dict[str, dict] = {}
    for c in channels:
        entry: dict[str, str] = {"TrainingInputMode": "File"}
        if c.content_type is not None:
            entry["ContentType"] = c.content_type
        config[c.name] = entry
    return config


def build_config_files(job: JobSpec, current_host: str, host_names: tuple[str, ...]) -> dict[str, str]:
    """input/config/*.json for one host: relative path -> file text."""
    groups = build_instance_groups(job, host_names)

    def dump(obj: object) -> str:
        return json.dumps(obj, indent=2) + "\n"

    return {
        "input/config/resourceconfig.json": dump(build_resource_config(current_host, host_names, groups)),
        "input/config/hyperparameters.json": dump(build_hyperparameters(job)),
        "input/config/inputdataconfig.json": dump(build_input_data_config(job.channels)),
    }


def build_host_directories(job: JobSpec) -> tuple[str, ...]:
    """Folders in a host's own /opt/ml tree (relative), mount points for shared ones included."""
    dirs = ["input/config", "input/data", "output/data", "model", "code"]
    dirs += [f"input/data/{c.name}" for c in job.channels]
    if job.code_dir is not None:
        dirs.append("shared")
    return tuple(dirs)


def build_job_mounts(job: JobSpec, layout: WorkdirLayout, host: str) -> tuple[Mount, ...]:
    """Bind mounts that make up /opt/ml inside one host, in mount order."""
    mounts = [
        Mount(layout.opt_ml(host), OPT_ML),
        Mount(layout.shared_model, f"{OPT_ML}/model"),
    ]
    if job.code_dir is not None:
        mounts.append(Mount(job.code_dir, f"{OPT_ML}/code"))
        mounts.append(Mount(layout.shared_shared, f"{OPT_ML}/shared"))
    for c in job.channels:
        mounts.append(Mount(c.source or layout.shared_channel(c.name), f"{OPT_ML}/input/data/{c.name}"))
    return tuple(mounts)


def build_private_mounts(
    layout: WorkdirLayout, host: str, with_etc_ssh: bool = True, with_root_ssh: bool = True,
    with_root_bashrc: bool = False,
) -> tuple[Mount, ...]:
    """Per-host copies of the files an entrypoint writes for SSH and MPI, so that nothing a job
    does touches this machine's /etc/ssh, /root/.ssh or /etc/environment. (/etc/ssh only when
    the machine has one; /root/.ssh not in a user namespace, where /root cannot be read.)
    with_root_bashrc: an empty /root/.bashrc, as in a container. bash reads it for every
    command sshd runs, and a development machine's (pyenv, cargo: ~0.15 s of CPU each time)
    would be in every SSH session the hosts open: at 16 hosts, seconds of a job's launch."""
    mounts = []
    if with_etc_ssh:
        mounts.append(Mount(layout.private(host, "etc-ssh"), "/etc/ssh"))
    if with_root_ssh:
        mounts.append(Mount(layout.private(host, "root-ssh"), "/root/.ssh"))
    if with_root_ssh and with_root_bashrc:
        mounts.append(Mount(layout.private(host, "root-bashrc"), ROOT_BASHRC, is_dir=False))
    mounts.append(Mount(layout.private(host, "environment"), "/etc/environment", is_dir=False))
    return tuple(mounts)


def validate_job(job: JobSpec, host_names: tuple[str, ...]) -> None:
    """Raise ValueError for anything the files above cannot be built from."""
    validate_channels(job.channels)
    build_instance_groups(job, host_names)
    build_distribution_hyperparameters(job)
    known_groups = {g.name for g in build_instance_groups(job, host_names)}
    for name in job.distribution_instance_groups:
        if name not in known_groups:
            raise ValueError(f"distribution instance group {name!r} is not one of {sorted(known_groups)}")
    for path in [job.code_dir] + [c.source for c in job.channels]:
        if path is not None and not os.path.isabs(path):
            raise ValueError(f"paths must be absolute here, got {path!r}")

"""The distribution keys (hyperparameters the SDK writes from `distribution=`) and our own
launch settings (BYOC_* environment variables), parsed and checked (pure)."""

from __future__ import annotations

import difflib
import shlex
from typing import Any, Mapping, NamedTuple

from entrypoint.config import JobConfig, canonical_json
from entrypoint.errors import JobDefinitionError

# launcher name -> the key that enables it
ENABLE_KEYS = {
    "mpi": "sagemaker_mpi_enabled",
    "pytorchddp": "sagemaker_pytorch_ddp_enabled",
    "torch_distributed": "sagemaker_torch_distributed_enabled",
    "smdataparallel": "sagemaker_distributed_dataparallel_enabled",
    "parameter_server": "sagemaker_parameter_server_enabled",
}
UNSUPPORTED_ENABLE_KEYS = {
    "sagemaker_pytorch_xla_multi_worker_enabled": "PyTorch/XLA training compiler jobs",
    "sagemaker_multi_worker_mirrored_strategy_enabled": "TensorFlow MultiWorkerMirroredStrategy",
}
MPI_PPH = "sagemaker_mpi_num_of_processes_per_host"
MPI_NP = "sagemaker_mpi_num_processes"
MPI_OPTIONS = "sagemaker_mpi_custom_mpi_options"
SMDDP_OPTIONS = "sagemaker_distributed_dataparallel_custom_mpi_options"
GROUPS = "sagemaker_distribution_instance_groups"
# Written by SDKs alongside distribution settings; nothing to decide from them.
INFORMATIONAL_KEYS = frozenset(
    {
        "sagemaker_instance_type",
        "sagemaker_network_interface_name",
        "sagemaker_estimator_class_name",
        "sagemaker_estimator_module",
    }
)
KNOWN_KEYS = (
    frozenset(ENABLE_KEYS.values())
    | {MPI_PPH, MPI_NP, MPI_OPTIONS, SMDDP_OPTIONS, GROUPS}
    | INFORMATIONAL_KEYS
)
# An unknown key with one of these prefixes is a misspelt distribution key: refuse it rather
# than silently train on one process.
DISTRIBUTION_PREFIXES = (
    "sagemaker_mpi",
    "sagemaker_pytorch",
    "sagemaker_torch",
    "sagemaker_distributed",
    "sagemaker_distribution",
    "sagemaker_parameter_server",
    "sagemaker_smdistributed",
    "sagemaker_smdataparallel",
    "sagemaker_dataparallel",
)
MPI_BASED = ("mpi", "pytorchddp", "smdataparallel")


class Distribution(NamedTuple):
    launcher: str  # "process" or one of ENABLE_KEYS
    processes_per_host: int | None  # explicit request; None: from the devices
    num_processes: int | None  # cap on the total (mpirun -np)
    custom_mpi_options: tuple[str, ...]
    instance_groups: tuple[str, ...] | None
    notes: tuple[str, ...] = ()


# Restarts in place are for transient crashes; a job failing the same way a hundred times is
# not transient.
MAX_RESTARTS_LIMIT = 100


class LaunchSettings(NamedTuple):
    master_port: int = 7777
    max_restarts: int = 0  # restarts in place after a rank fails (BYOC_MAX_RESTARTS; see decide_restart)
    grace_period_s: float = 90.0
    host_resolution_timeout_s: float = 300.0
    neuron_parallel_compile: bool = False
    ssh_port: int = 22
    peer_wait_timeout_s: float = 300.0
    host_lost_timeout_s: float = 30.0
    job_port: int = 7778
    hang_timeout_s: float = 0.0  # BYOC_HANG_TIMEOUT_S: silence after which the job is hung (hangs.py); 0: off


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise JobDefinitionError(
        f"The hyperparameter {key} must be true or false, but it is {canonical_json(value)}."
    )


def _as_positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    else:
        number = None
    if number is None or number < 1:
        raise JobDefinitionError(
            f"The hyperparameter {key} must be a whole number of at least 1, but it is "
            f"{canonical_json(value)}."
        )
    return number


def _as_options(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, str):
        raise JobDefinitionError(
            f"The hyperparameter {key} must be a string of mpirun options, but it is "
            f"{canonical_json(value)}."
        )
    try:
        return tuple(shlex.split(value))
    except ValueError as exc:
        raise JobDefinitionError(
            f"The hyperparameter {key} cannot be split into mpirun options ({exc}): {value!r}."
        ) from None


def parse_distribution(job: JobConfig) -> Distribution:
    framework: Mapping[str, Any] = job.hyperparameters.framework
    notes: list[str] = []
    for key in sorted(framework):
        if key in KNOWN_KEYS:
            continue
        if key in UNSUPPORTED_ENABLE_KEYS:
            if framework[key] in (False, "false", "False"):
                continue
            raise JobDefinitionError(
                f"The hyperparameter {key} asks for {UNSUPPORTED_ENABLE_KEYS[key]}, which this "
                f"image does not run. Use distribution={{\"torch_distributed\": {{\"enabled\": "
                f"true}}}} (torchrun) or {{\"mpi\": ...}} instead."
            )
        if key.startswith(DISTRIBUTION_PREFIXES):
            close = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise JobDefinitionError(
                f"Unknown distribution hyperparameter {key}.{hint} Known keys: "
                f"{', '.join(sorted(KNOWN_KEYS - INFORMATIONAL_KEYS))}."
            )
        notes.append(f"ignoring unrecognised framework hyperparameter {key}")

    enabled = [name for name, key in ENABLE_KEYS.items() if key in framework and _as_bool(key, framework[key])]
    if len(enabled) > 1:
        keys = " and ".join(ENABLE_KEYS[name] for name in enabled)
        raise JobDefinitionError(
            f"The distribution settings contradict each other: {keys} are all enabled. "
            f"Enable exactly one launcher in the estimator's distribution= argument."
        )
    launcher = enabled[0] if enabled else "process"

    def only_with(key: str, launchers: tuple[str, ...], what: str) -> None:
        if key in framework and launcher not in launchers:
            raise JobDefinitionError(
                f"The hyperparameter {key} is set, but {what} is not enabled (the launcher is "
                f"{launcher}). Remove it, or enable {what}."
            )

    only_with(MPI_PPH, MPI_BASED, "MPI")
    only_with(MPI_NP, MPI_BASED, "MPI")
    only_with(MPI_OPTIONS, MPI_BASED, "MPI")
    only_with(SMDDP_OPTIONS, ("smdataparallel",), "smdistributed dataparallel")

    options: tuple[str, ...] = ()
    if MPI_OPTIONS in framework:
        options += _as_options(MPI_OPTIONS, framework[MPI_OPTIONS])
    if SMDDP_OPTIONS in framework:
        options += _as_options(SMDDP_OPTIONS, framework[SMDDP_OPTIONS])

    groups = None
    if GROUPS in framework:
        value = framework[GROUPS]
        if not isinstance(value, list) or not all(isinstance(g, str) and g for g in value):
            raise JobDefinitionError(
                f"The hyperparameter {GROUPS} must be a list of instance group names, but it "
                f"is {canonical_json(value)}."
            )
        known = [g.name for g in job.resource.instance_groups]
        unknown = [g for g in value if known and g not in known]
        if unknown:
            raise JobDefinitionError(
                f"The hyperparameter {GROUPS} names {', '.join(unknown)}, which "
                f"{'is' if len(unknown) == 1 else 'are'} not an instance group of this job "
                f"({', '.join(known)})."
            )
        if not known:
            notes.append(f"{GROUPS} is set but resourceconfig.json has no instance groups; every host takes part")
        groups = tuple(value)

    return Distribution(
        launcher=launcher,
        processes_per_host=_as_positive_int(MPI_PPH, framework[MPI_PPH]) if MPI_PPH in framework else None,
        num_processes=_as_positive_int(MPI_NP, framework[MPI_NP]) if MPI_NP in framework else None,
        custom_mpi_options=options,
        instance_groups=groups,
        notes=tuple(notes),
    )


def parse_launch_settings(environ: Mapping[str, str]) -> LaunchSettings:
    def number(name: str, default: float, kind: type, low: float, high: float | None = None):
        raw = environ.get(name)
        if raw is None or raw == "":
            return default
        try:
            value = kind(raw)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise JobDefinitionError(
                f"The environment variable {name}={raw!r} must be a {kind.__name__} {bound}."
            )
        return value

    master_port = number("BYOC_MASTER_PORT", 7777, int, 1, 65535)
    # BYOC_TORCHRUN_MAX_RESTARTS: the name from before restarts covered every launcher.
    restarts_name = "BYOC_MAX_RESTARTS" if environ.get("BYOC_MAX_RESTARTS") else "BYOC_TORCHRUN_MAX_RESTARTS"
    return LaunchSettings(
        master_port=master_port,
        max_restarts=number(restarts_name, 0, int, 0, MAX_RESTARTS_LIMIT),
        grace_period_s=number("BYOC_GRACE_PERIOD_S", 90.0, float, 0.0),
        host_resolution_timeout_s=number("BYOC_HOST_RESOLUTION_TIMEOUT_S", 300.0, float, 0.0),
        neuron_parallel_compile=environ.get("RUN_NEURON_PARALLEL_COMPILE") == "1",
        ssh_port=number("BYOC_SSH_PORT", 22, int, 1, 65535),
        peer_wait_timeout_s=number("BYOC_PEER_WAIT_TIMEOUT_S", 300.0, float, 0.0),
        host_lost_timeout_s=number("BYOC_HOST_LOST_TIMEOUT_S", 30.0, float, 1.0, 60.0),
        job_port=number("BYOC_JOB_PORT", master_port + 1 if master_port < 65535 else 7778, int, 1, 65535),
        hang_timeout_s=number("BYOC_HANG_TIMEOUT_S", 0.0, float, 0.0),
    )

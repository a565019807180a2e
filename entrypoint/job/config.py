"""What SageMaker hands the container, read into frozen records.

`parse_*` functions are pure: they take decoded JSON (or raw text) and return records or
raise JobDefinitionError with one paragraph that names the file and key at fault.
`load_job` is the only function here that touches the file system or the environment.

The records of the launch path (here, and in distribution, probe, program, plan...) are
typing.NamedTuple classes, not dataclasses: a frozen dataclass costs about 1 ms to define
(its methods are generated with exec) and `dataclasses` imports inspect, ast and dis, about
30 ms of every container start in all; a NamedTuple costs about 0.2 ms. `record._replace(...)`
stands in for dataclasses.replace.
"""

from __future__ import annotations

import json
import os
import re
from types import MappingProxyType
from typing import Any, Mapping, NamedTuple

from entrypoint.errors import JobDefinitionError
from entrypoint.job.json_text import JSON_DEPTH_LIMIT, JsonTooDeep, canonical_json, decode_json
from entrypoint.job.paths import MlPaths

RESOURCE_CONFIG = "resourceconfig.json"
HYPERPARAMETERS = "hyperparameters.json"
INPUT_DATA_CONFIG = "inputdataconfig.json"
CHECKPOINT_CONFIG = "checkpointconfig.json"
TENSORBOARD_CONFIG = "tensorboardoutputconfig.json"

# Hyperparameters the SDK writes for the platform, not for the user's script
# (sagemaker_training.params.SAGEMAKER_HYPERPARAMETERS). Everything else starting with
# "sagemaker_" is a framework parameter (distribution keys and the like).
PLATFORM_HYPERPARAMETERS = frozenset(
    {
        "sagemaker_program",
        "sagemaker_submit_directory",
        "sagemaker_enable_cloudwatch_metrics",
        "sagemaker_region",
        "sagemaker_container_log_level",
        "sagemaker_job_name",
        "default_user_module_name",
        "_tuning_objective_metric",
        "sagemaker_s3_output",
    }
)
SAGEMAKER_PREFIX = "sagemaker_"

INPUT_MODES = ("File", "Pipe", "FastFile")
DISTRIBUTION_TYPES = ("FullyReplicated", "ShardedByS3Key")


def frozen_mapping(items: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(items))


class InstanceGroup(NamedTuple):
    name: str
    instance_type: str
    hosts: tuple[str, ...]


class ResourceConfig(NamedTuple):
    current_host: str
    hosts: tuple[str, ...]  # as given: SageMaker sorts as strings (algo-10 before algo-2)
    current_instance_type: str
    current_group_name: str
    instance_groups: tuple[InstanceGroup, ...]
    network_interface_name: str
    raw: Mapping[str, Any]  # the file as read, for SM_RESOURCE_CONFIG and friends


class Hyperparameters(NamedTuple):
    """Every hyperparameter JSON-decoded (the raw string kept when it is not JSON)."""

    values: Mapping[str, Any]

    @property
    def user(self) -> Mapping[str, Any]:
        """What the user's script receives: all but sagemaker_* and the platform keys."""
        return frozen_mapping(
            {k: v for k, v in self.values.items() if not _is_sagemaker_key(k)}
        )

    @property
    def sagemaker(self) -> Mapping[str, Any]:
        return frozen_mapping({k: v for k, v in self.values.items() if _is_sagemaker_key(k)})

    @property
    def framework(self) -> Mapping[str, Any]:
        """sagemaker_* keys that are not platform keys: the distribution settings."""
        return frozen_mapping(
            {k: v for k, v in self.sagemaker.items() if k not in PLATFORM_HYPERPARAMETERS}
        )


def _is_sagemaker_key(key: str) -> bool:
    return key in PLATFORM_HYPERPARAMETERS or key.startswith(SAGEMAKER_PREFIX)


class Channel(NamedTuple):
    name: str
    input_mode: str  # File, Pipe or FastFile
    distribution: str  # FullyReplicated or ShardedByS3Key
    content_type: str | None


class InputDataConfig(NamedTuple):
    channels: tuple[Channel, ...]
    raw: Mapping[str, Any]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.channels)


class CheckpointConfig(NamedTuple):
    local_path: str
    s3_uri: str | None


class JobConfig(NamedTuple):
    """Everything read from /opt/ml and the process environment, before any decision."""

    paths: MlPaths
    resource: ResourceConfig
    hyperparameters: Hyperparameters
    input_data: InputDataConfig
    checkpoint: CheckpointConfig | None
    program: str | None  # SAGEMAKER_PROGRAM or sagemaker_program
    program_from_env: bool  # SAGEMAKER_PROGRAM wins over the hyperparameter, as in the toolkit
    environ: Mapping[str, str]  # the entrypoint's own environment, as it was at start
    sdk_v3: Any = None  # a v3_definition.V3Job when SDK v3's sm_train.sh was handed to us
    # A TensorBoard output config's LocalPath (SageMaker syncs that folder to S3 while the job
    # runs); None without the file.
    tensorboard_path: str | None = None


# --- parsing (pure) -----------------------------------------------------------------------


def parse_json_document(text: str, file_name: str) -> Any:
    try:
        return decode_json(text)
    except JsonTooDeep:
        raise JobDefinitionError(
            f"{file_name} is nested too deeply to be a SageMaker configuration file (arrays or "
            f"objects within each other more than {JSON_DEPTH_LIMIT} levels down)."
        ) from None
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError
        raise JobDefinitionError(
            f"{file_name} is not valid JSON ({exc}). SageMaker writes this file from the "
            f"training job request; when you write it yourself (local tests), check it with "
            f"`python -m json.tool {file_name}`."
        ) from None


def _require_object(value: Any, file_name: str) -> dict:
    if not isinstance(value, dict):
        raise JobDefinitionError(
            f"{file_name} must hold a JSON object, but it holds {_json_type(value)}."
        )
    return value


def _json_type(value: Any) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _string_field(obj: dict, key: str, where: str, default: str | None = None) -> str:
    if key not in obj or obj[key] is None:
        if default is None:
            raise JobDefinitionError(f"{where} has no \"{key}\"; it is required.")
        return default
    value = obj[key]
    if not isinstance(value, str) or not value:
        raise JobDefinitionError(
            f"\"{key}\" in {where} must be a non-empty string, but it is {_json_type(value)}"
            f"{'' if not isinstance(value, str) else ' (empty)'}."
        )
    return value


# Values from resourceconfig.json that reach an argv (ssh and mpirun take host names,
# torchrun --master_addr, Open MPI and NCCL the interface): what each may be. None may start
# with "-" (ssh, mpirun or torchrun would read it as an option) or hold whitespace or control
# characters. Host names: DNS names and SageMaker's algo-N; interfaces: Linux's 15 bytes.
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
INTERFACE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@-]{0,14}")
GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_RULES = {
    HOST_NAME: "a host name: letters, digits, '.', '_' and '-', not starting with '-' or '.', at most 253",
    INTERFACE_NAME: "a network interface name: letters, digits, '.', '_', '@' and '-', not starting with '-', at most 15",
    GROUP_NAME: "an instance group name: letters, digits, '.', '_' and '-', not starting with '-', at most 128",
}


def _checked(value: str, pattern: re.Pattern, key: str, where: str) -> str:
    """value when it matches pattern; otherwise a JobDefinitionError naming the file and key."""
    if pattern.fullmatch(value):
        return value
    shown = json.dumps(value[:80]) + ("…" if len(value) > 80 else "")
    raise JobDefinitionError(
        f"\"{key}\" in {where} has {shown}, which is not {_RULES[pattern]} characters. "
        f"It would be passed to ssh, mpirun or torchrun as a command-line argument, so it is refused."
    )


def _string_list(obj: dict, key: str, where: str) -> tuple[str, ...]:
    value = obj.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise JobDefinitionError(
            f"\"{key}\" in {where} must be a list of host names (non-empty strings), "
            f"but it is {_json_type(value) if key in obj else 'missing'}."
        )
    if len(set(value)) != len(value):
        dupes = sorted({v for v in value if value.count(v) > 1})
        raise JobDefinitionError(f"\"{key}\" in {where} lists {', '.join(dupes)} more than once.")
    return tuple(_checked(v, HOST_NAME, key, where) for v in value)


def _parse_instance_groups(groups_raw: Any, hosts: tuple[str, ...], where: str) -> list[InstanceGroup]:
    if not isinstance(groups_raw, list):
        raise JobDefinitionError(
            f"\"instance_groups\" in {where} must be a list, but it is {_json_type(groups_raw)}."
        )
    groups = []
    for i, group in enumerate(groups_raw):
        gwhere = f"instance_groups[{i}] of {where}"
        if not isinstance(group, dict):
            raise JobDefinitionError(f"{gwhere} must be an object, but it is {_json_type(group)}.")
        name = _checked(_string_field(group, "instance_group_name", gwhere), GROUP_NAME, "instance_group_name", gwhere)
        group_hosts = _string_list(group, "hosts", gwhere)
        strangers = [h for h in group_hosts if h not in hosts]
        if strangers:
            raise JobDefinitionError(
                f"Instance group \"{name}\" in {where} lists {', '.join(strangers)}, "
                f"which {'is' if len(strangers) == 1 else 'are'} not in \"hosts\"."
            )
        groups.append(InstanceGroup(name=name, instance_type=_string_field(group, "instance_type", gwhere, default="local"),
                                    hosts=group_hosts))
    return groups


def parse_resource_config(doc: Any) -> ResourceConfig:
    where = RESOURCE_CONFIG
    obj = _require_object(doc, where)
    hosts = _string_list(obj, "hosts", where)
    if not hosts:
        raise JobDefinitionError(
            f"\"hosts\" in {where} is empty: a training job needs at least one host."
        )
    current_host = _checked(_string_field(obj, "current_host", where), HOST_NAME, "current_host", where)
    if current_host not in hosts:
        raise JobDefinitionError(
            f"current_host \"{current_host}\" in {where} is not one of its hosts "
            f"({', '.join(hosts)}). Each host's resourceconfig.json must name that host "
            f"itself as current_host."
        )
    groups = _parse_instance_groups(obj.get("instance_groups") or [], hosts, where)
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        raise JobDefinitionError(f"{where} names an instance group twice: {names}.")
    current_group = _string_field(obj, "current_group_name", where, default="homogeneousCluster")
    if groups and current_group not in names:
        raise JobDefinitionError(
            f"current_group_name \"{current_group}\" in {where} is not one of its "
            f"instance_groups ({', '.join(names)})."
        )
    return ResourceConfig(
        current_host=current_host,
        hosts=hosts,
        current_instance_type=_string_field(obj, "current_instance_type", where, default="local"),
        current_group_name=current_group,
        instance_groups=tuple(groups),
        network_interface_name=_checked(
            _string_field(obj, "network_interface_name", where, default="eth0"),
            INTERFACE_NAME, "network_interface_name", where,
        ),
        raw=frozen_mapping(obj),
    )


def decode_hyperparameter(value: Any) -> Any:
    """SDK >= 2.110 JSON-encodes every value ("\\"train.py\\""); older ones write plain strings.
    Decode as JSON, fall back to the raw value: the toolkit's rule, kept for parity."""
    if not isinstance(value, str):
        return value
    try:
        return decode_json(value)
    except ValueError:  # not JSON, or nested deeper than JSON_DEPTH_LIMIT (JsonTooDeep)
        return value


def parse_hyperparameters(doc: Any) -> Hyperparameters:
    obj = _require_object(doc, HYPERPARAMETERS)
    return Hyperparameters(
        values=frozen_mapping({k: decode_hyperparameter(v) for k, v in obj.items()})
    )


def parse_input_data_config(doc: Any) -> InputDataConfig:
    where = INPUT_DATA_CONFIG
    obj = _require_object(doc, where)
    channels = []
    for name, spec in obj.items():
        if not name or "/" in name or name in (".", "..") or "\x00" in name:
            raise JobDefinitionError(
                f"Channel name {name!r} in {where} cannot be used as a folder name under "
                f"input/data/; use letters, digits, '-', '_' and '.'."
            )
        cwhere = f"channel \"{name}\" of {where}"
        if not isinstance(spec, dict):
            raise JobDefinitionError(f"The {cwhere} must be an object, but it is {_json_type(spec)}.")
        mode = _string_field(spec, "TrainingInputMode", cwhere, default="File")
        if mode not in INPUT_MODES:
            raise JobDefinitionError(
                f"TrainingInputMode \"{mode}\" of the {cwhere} is not one of "
                f"{', '.join(INPUT_MODES)}."
            )
        distribution = _string_field(spec, "S3DistributionType", cwhere, default="FullyReplicated")
        if distribution not in DISTRIBUTION_TYPES:
            raise JobDefinitionError(
                f"S3DistributionType \"{distribution}\" of the {cwhere} is not one of "
                f"{', '.join(DISTRIBUTION_TYPES)}."
            )
        content_type = spec.get("ContentType")
        if content_type is not None and not isinstance(content_type, str):
            raise JobDefinitionError(f"ContentType of the {cwhere} must be a string.")
        channels.append(Channel(name, mode, distribution, content_type))
    return InputDataConfig(channels=tuple(channels), raw=frozen_mapping(obj))


def parse_checkpoint_config(doc: Any, paths: MlPaths) -> CheckpointConfig:
    where = CHECKPOINT_CONFIG
    obj = _require_object(doc, where)
    default = os.path.join(paths.base, "checkpoints")
    local_path = _string_field(obj, "LocalPath", where, default=default)
    s3_uri = obj.get("S3Uri")
    if s3_uri is not None and not isinstance(s3_uri, str):
        raise JobDefinitionError(f"\"S3Uri\" in {where} must be a string.")
    return CheckpointConfig(local_path=local_path, s3_uri=s3_uri)


def parse_tensorboard_config(doc: Any, paths: MlPaths) -> str:
    """The folder SageMaker syncs to S3 while the job runs: LocalPath, default
    output/tensorboard (what smdebug reads from the same file)."""
    obj = _require_object(doc, TENSORBOARD_CONFIG)
    return _string_field(obj, "LocalPath", TENSORBOARD_CONFIG, default=os.path.join(paths.base, "output", "tensorboard"))


def parse_program(hyperparameters: Hyperparameters, environ: Mapping[str, str]) -> tuple[str | None, bool]:
    from_env = environ.get("SAGEMAKER_PROGRAM")
    if from_env:
        return from_env, True
    value = hyperparameters.values.get("sagemaker_program")
    if value is None or value == "":
        return None, False
    if not isinstance(value, str):
        raise JobDefinitionError(
            f"The hyperparameter sagemaker_program must be the name of a script (a string), "
            f"but it is {_json_type(value)}: {canonical_json(value)}."
        )
    return value, False


# --- loading (I/O) ------------------------------------------------------------------------


# SageMaker's own files are small (at most 100 hyperparameters of 2,500 characters); a file
# far larger is not one SageMaker wrote, and reading it whole would cost memory unbounded.
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def _read_config(paths: MlPaths, name: str, required: bool) -> Any:
    path = paths.config_file(name)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        if required:
            raise JobDefinitionError(
                f"{path} does not exist. SageMaker writes it before starting the container; "
                f"when running outside SageMaker, create it (see README, \"Run a job "
                f"locally\") or point SAGEMAKER_BASE_DIR at a prepared tree."
            ) from None
        return None
    except OSError as exc:
        raise JobDefinitionError(f"{path} cannot be read: {exc.strerror}.") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise JobDefinitionError(
            f"{path} is larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB: not a file SageMaker writes "
            f"(it allows at most 100 hyperparameters of 2,500 characters). Pass large values in a file "
            f"(an input channel) instead."
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise JobDefinitionError(f"{path} is not UTF-8 text.") from None
    return parse_json_document(text, name)


def load_job(paths: MlPaths, environ: Mapping[str, str]) -> JobConfig:
    resource = parse_resource_config(_read_config(paths, RESOURCE_CONFIG, required=True))
    hp_doc = _read_config(paths, HYPERPARAMETERS, required=False)
    hyperparameters = parse_hyperparameters({} if hp_doc is None else hp_doc)
    idc_doc = _read_config(paths, INPUT_DATA_CONFIG, required=False)
    input_data = parse_input_data_config({} if idc_doc is None else idc_doc)
    ckpt_doc = _read_config(paths, CHECKPOINT_CONFIG, required=False)
    checkpoint = None if ckpt_doc is None else parse_checkpoint_config(ckpt_doc, paths)
    program, program_from_env = parse_program(hyperparameters, environ)
    sdk_v3 = load_handed_v3_job(paths, environ)
    if sdk_v3 is not None:
        program, program_from_env = sdk_v3.entry_script, False
        if sdk_v3.source_dir:
            paths = paths._replace(code=paths.channel_dir("code"))
    tb_doc = _read_config(paths, TENSORBOARD_CONFIG, required=False)
    return JobConfig(
        paths=paths,
        resource=resource,
        hyperparameters=hyperparameters,
        input_data=input_data,
        checkpoint=checkpoint,
        program=program,
        program_from_env=program_from_env,
        environ=frozen_mapping(environ),
        sdk_v3=sdk_v3,
        tensorboard_path=None if tb_doc is None else parse_tensorboard_config(tb_doc, paths),
    )


def load_handed_v3_job(paths: MlPaths, environ: Mapping[str, str]) -> Any:
    """The SDK v3 job bash-env.sh handed to this launcher (job/v3_definition.py), or None.
    cli.main has already sent what this launcher does not understand to v3's own drivers."""
    if environ.get("BYOC_SDK_V3_RUN") != "byoc":  # v3_definition.RUN_ENV, HANDED: no import on other jobs
        return None
    from entrypoint.job import v3_definition as v3

    try:
        return v3.load_handed_v3_job(paths, environ)
    except v3.V3NotUnderstood as exc:
        raise JobDefinitionError(f"The SDK v3 job cannot be read: {exc}.") from None


def find_missing_channel_dirs(job: JobConfig) -> list[str]:
    """File and FastFile channels must be folders under input/data; Pipe channels are FIFOs
    named <channel>_<epoch>, created by the platform as the script reads them."""
    return [
        c.name
        for c in job.input_data.channels
        if c.input_mode != "Pipe" and not os.path.isdir(job.paths.channel_dir(c.name))
    ]

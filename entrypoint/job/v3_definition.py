"""A SageMaker Python SDK v3 `ModelTrainer` job, read from its driver channel.

v3 (sagemaker-train 1.27 / sagemaker 3.27.0) replaces the ENTRYPOINT with
`/bin/bash -c "chmod +x …/sm_drivers/sm_train.sh && …/sm_train.sh"` and puts the job's
definition in the `sm_drivers` channel:
- sourcecode.json: `SourceCode.model_dump()` (source_dir, requirements, entry_script, command,
  args, ignore_patterns);
- distributed.json: `Torchrun.model_dump()` (process_count_per_node, smp), `MPI.model_dump()`
  (process_count_per_node, mpi_additional_options), or `{}`;
- sm_train.sh: `cd /opt/ml/input/data/code` when there is a source_dir, the requirements
  step, then one of: the basic script driver, a distributed driver, or the command.

/etc/byoc/bash-env.sh, read by that `bash -c` before it runs anything, hands the job to
`python3 -m entrypoint train` (BYOC_SDK_V3_RUN=byoc, the bash command kept in
BYOC_SDK_V3_COMMAND). This module reads the definition into a V3Job; what it does not
understand raises V3NotUnderstood, and the launcher gives the job back to v3's own drivers
(cli.start_v3_drivers). `parse_*` are pure; `load_v3_job` reads the three files.
"""

from __future__ import annotations

import os
import shlex
from typing import Any, Mapping, NamedTuple

from entrypoint.job.json_text import decode_json
from entrypoint.job.paths import MlPaths

DRIVERS_CHANNEL = "sm_drivers"
TRAIN_SCRIPT = "sm_train.sh"
SOURCE_CODE_JSON = "sourcecode.json"
DISTRIBUTED_JSON = "distributed.json"
# Who runs a v3 job: set by bash-env.sh ("byoc") when it hands PID 1's sm_train.sh to our
# launcher; "sdk" when v3's own drivers run it (the fallback, or the user's choice below); our
# launcher gives its processes "launched", so neither a rank's bash nor a nested
# `python -m entrypoint train` takes the job again.
RUN_ENV = "BYOC_SDK_V3_RUN"
COMMAND_ENV = "BYOC_SDK_V3_COMMAND"  # the `bash -c` command v3 gave PID 1, for the fallback
CHOICE_ENV = "BYOC_SDK_V3_DRIVERS"  # "sdk": the user asks for v3's own drivers
HANDED, SDK, LAUNCHED = "byoc", "sdk", "launched"
# constants.DEFAULT_CONTAINER_ARGUMENTS of sagemaker-train 1.27, when the hook passed none.
DEFAULT_COMMAND = ("chmod +x /opt/ml/input/data/sm_drivers/sm_train.sh "
                   "&& /opt/ml/input/data/sm_drivers/sm_train.sh")

SOURCE_CODE_KEYS = frozenset({"source_dir", "requirements", "entry_script", "command", "args", "ignore_patterns"})
TORCHRUN_KEYS = frozenset({"process_count_per_node", "smp"})
MPI_KEYS = frozenset({"process_count_per_node", "mpi_additional_options"})
# How sm_train.sh names what it runs (templates.py of sagemaker-train 1.27).
DRIVER_MARKS = {
    "command": "SAGEMAKER_BASE_COMMAND_EOF",
    "torchrun": "distributed_drivers/torchrun_driver.py",
    "mpi": "distributed_drivers/mpi_driver.py",
    "script": "distributed_drivers/basic_script_driver.py",
}


class V3NotUnderstood(Exception):
    """A v3 definition this launcher does not map: v3's own drivers run the job. The message
    is the one log line that says why."""


class V3Job(NamedTuple):
    """What a v3 job asks for, in v3's own terms."""

    driver: str  # "script" (no distributed), "torchrun", "mpi" or "command"
    entry_script: str | None
    command: str | None  # the bash command line exactly as v3 builds it (args shell-quoted)
    source_dir: bool  # the code is the `code` channel (v3 cds there)
    requirements: str | None  # a file relative to the code folder
    process_count_per_node: int | None
    mpi_options: tuple[str, ...]
    definition: Mapping[str, Any]  # distributed.json as read: SM_DISTRIBUTED_CONFIG


# --- parsing (pure) -----------------------------------------------------------------------


def parse_driver(train_script: str) -> str:
    """Which of v3's runs sm_train.sh ends in; exactly one must be named."""
    found = [name for name, mark in DRIVER_MARKS.items() if mark in train_script]
    if len(found) != 1:
        raise V3NotUnderstood(f"{TRAIN_SCRIPT} runs {' and '.join(found) or 'no driver this image knows'}")
    return found[0]


def build_v3_command(command: str, args: Any) -> str:
    """ModelTrainer._prepare_train_script: the command's words joined by one space, then each
    of SourceCode.args shell-quoted; sm_train.sh runs it with `eval`."""
    parts = command.split()
    if args:
        if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
            raise V3NotUnderstood("SourceCode.args is not a list of strings and numbers")
        parts.extend(shlex.quote(str(a)) for a in args)
    return " ".join(parts)


def _optional_str(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise V3NotUnderstood(f"SourceCode.{key} is not a string")
    return value


def parse_process_count(distributed: Mapping[str, Any]) -> int | None:
    """The whole number v3 wrote (its range: decide/distribution.parse_v3_counts, by the one rule
    for numbers, which refuses the job); None for the devices' count."""
    value = distributed.get("process_count_per_node")
    if value is None or value == 0:  # v3: `process_count_per_node or 0`, then the devices
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise V3NotUnderstood(f"process_count_per_node is {str(value)[:60]!r}, not a whole number")
    return value


def parse_distributed(driver: str, distributed: Mapping[str, Any]) -> tuple[int | None, tuple[str, ...]]:
    """(processes per host, mpirun options) of a Torchrun() or MPI() definition."""
    keys = set(distributed)
    expected = {"torchrun": TORCHRUN_KEYS, "mpi": MPI_KEYS}.get(driver, frozenset())
    if driver in ("script", "command"):
        return None, ()  # v3 ignores distributed.json for these
    if keys - expected:
        raise V3NotUnderstood(f"distributed.json has {', '.join(sorted(keys - expected))}, "
                              f"which {driver} does not take in SDK v3 3.27")
    if driver == "torchrun" and distributed.get("smp"):
        raise V3NotUnderstood("Torchrun(smp=…) asks for SageMaker model parallelism v2, AWS's own library")
    options = distributed.get("mpi_additional_options") or []
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise V3NotUnderstood("MPI.mpi_additional_options is not a list of strings")
    return parse_process_count(distributed), tuple(options)


def parse_v3_job(source_code: Any, distributed: Any, train_script: str) -> V3Job:
    """The job from sourcecode.json, distributed.json (decoded) and sm_train.sh's text."""
    if not isinstance(source_code, dict) or not isinstance(distributed, dict):
        raise V3NotUnderstood(f"{SOURCE_CODE_JSON} or {DISTRIBUTED_JSON} is not a JSON object")
    unknown = set(source_code) - SOURCE_CODE_KEYS
    if unknown:
        raise V3NotUnderstood(f"{SOURCE_CODE_JSON} has {', '.join(sorted(unknown))}, a field SDK v3 3.27 does not write")
    driver = parse_driver(train_script)
    source_dir = _optional_str(source_code, "source_dir")
    if source_dir and source_dir.endswith(".tar.gz"):
        raise V3NotUnderstood("SourceCode.source_dir is a .tar.gz, which sm_train.sh unpacks in the shared code channel")
    command = _optional_str(source_code, "command")
    entry_script = _optional_str(source_code, "entry_script")
    if (driver == "command") != (command is not None) or (driver != "command" and entry_script is None):
        raise V3NotUnderstood(f"{TRAIN_SCRIPT} and {SOURCE_CODE_JSON} disagree on what to run")
    per_host, options = parse_distributed(driver, distributed)
    return V3Job(
        driver=driver,
        entry_script=None if driver == "command" else entry_script,
        command=build_v3_command(command, source_code.get("args")) if command else None,
        source_dir=source_dir is not None,
        requirements=_optional_str(source_code, "requirements"),
        process_count_per_node=per_host,
        mpi_options=options,
        definition=dict(distributed) if driver in ("torchrun", "mpi") else {},
    )


def decide_v3_route(environ: Mapping[str, str]) -> str | None:
    """None: this process does not run a handed-over v3 job (SDK v2, the ENTRYPOINT, a nested
    launcher); "sdk": the user asks for v3's own drivers; "byoc": read it and launch it."""
    if environ.get(RUN_ENV) != HANDED:
        return None
    return SDK if parse_drivers_choice(environ.get(CHOICE_ENV)) == SDK else HANDED


def parse_drivers_choice(raw: str | None) -> str | None:
    """BYOC_SDK_V3_DRIVERS (its row of the settings table reads it by this): "sdk" in any case
    and spacing asks for v3's own drivers; anything else, this image's launcher (None)."""
    return SDK if (raw or "").strip().lower() == SDK else None


def is_legacy_train_command(job: V3Job) -> bool:
    """`SourceCode(command="train")`: the old way to reach this launcher from v3, with the
    launcher keys as hyperparameters: read the job from hyperparameters.json as before."""
    return job.driver == "command" and (job.command or "").split()[:1] == ["train"]


# --- reading (I/O) ------------------------------------------------------------------------


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(1024 * 1024)
    except (OSError, UnicodeDecodeError) as exc:
        raise V3NotUnderstood(f"{path} cannot be read ({exc})") from None


def _read_json(path: str) -> Any:
    text = _read_text(path)
    try:
        return decode_json(text) if text.strip() else {}
    except ValueError as exc:
        raise V3NotUnderstood(f"{path} is not JSON ({exc})") from None


def load_v3_job(drivers_dir: str) -> V3Job:
    """The v3 job in the sm_drivers channel; V3NotUnderstood for anything else."""
    return parse_v3_job(_read_json(os.path.join(drivers_dir, SOURCE_CODE_JSON)),
                        _read_json(os.path.join(drivers_dir, DISTRIBUTED_JSON)),
                        _read_text(os.path.join(drivers_dir, TRAIN_SCRIPT)))


def load_handed_v3_job(paths: MlPaths, environ: Mapping[str, str]) -> V3Job | None:
    """The job bash-env.sh handed over, or None: not handed over, v3's drivers chosen, or the
    legacy `command="train"` (hyperparameters.json then defines the job)."""
    if decide_v3_route(environ) != HANDED:
        return None
    job = load_v3_job(paths.channel_dir(DRIVERS_CHANNEL))
    return None if is_legacy_train_command(job) else job

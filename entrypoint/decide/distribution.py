"""The distribution keys (hyperparameters the SDK writes from `distribution=`) and our own
launch settings (BYOC_* environment variables), parsed and checked (pure)."""

from __future__ import annotations

import json
import re
import shlex
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

from entrypoint.job.config import GROUP_NAME, HYPERPARAMETERS, JobConfig
from entrypoint.job.json_text import canonical_json
from entrypoint.decide.numbers import MAX_PROCESSES_PER_HOST, parse_count
from entrypoint.errors import JobDefinitionError

if TYPE_CHECKING:
    from entrypoint.job.probe import MachineFacts
    from entrypoint.job.v3_definition import V3Job

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
# The SDK's launchers made to run one process per GPU: with no GPU (nor Neuron core), 1 per host, said so.
ONE_PER_GPU = ("pytorchddp", "smdataparallel")


class Distribution(NamedTuple):
    launcher: str  # "process" or one of ENABLE_KEYS
    processes_per_host: int | None  # explicit request; None: from the devices
    num_processes: int | None  # cap on the total (mpirun -np)
    custom_mpi_options: tuple[str, ...]
    instance_groups: tuple[str, ...] | None
    notes: tuple[str, ...] = ()
    # SDK v3's `-np N` in MPI.mpi_additional_options, (the option as written, N): the plan must
    # start exactly N processes (decide/v3_launch.check_v3_process_count).
    np_option: tuple[str, int] | None = None


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise JobDefinitionError(
        f"The hyperparameter {key} must be true or false, but it is {canonical_json(value)}."
    )


def _as_count(key: str, value: Any, high: int | None = None) -> int:
    """A hyperparameter that counts processes, by the one rule (decide/numbers.py): no "٣", no
    "1_0", no 10**29 per host."""
    number = parse_count(value, high)
    if number is None:
        bound = f"from 1 to {high}" if high is not None else "of at least 1"
        raise JobDefinitionError(
            f"The hyperparameter {key} must be a whole number {bound}, but it is {_shown(canonical_json(value))}."
        )
    return number


# mpirun's options (Open MPI 4.1, `mpirun --help all`) and how many values each takes. mpirun
# accepts each with one dash or two; anything else starting with "-" it refuses as unknown,
# and the first word that is not an option or an option's value is the program it runs.
_MPIRUN_FLAGS = (
    "allow-run-as-root bind-to-core bind-to-socket bycore bynode byslot continuous d debug "
    "debug-daemons debug-daemons-file debug-devel disable-recovery display-allocation "
    "display-devel-allocation display-devel-map display-diffable-map display-map display-topo "
    "do-not-launch do-not-resolve dvm enable-instant-on-support enable-recovery fwd-mpirun-port "
    "get-stack-traces index-argv-by-rank leave-session-attached merge-stderr-to-stdout nolocal "
    "nooversubscribe noprefix novm output-proctable oversubscribe pernode preload-binary q quiet "
    "report-bindings report-child-jobs-separately report-state-on-timeout s "
    "set-cwd-to-session-dir show-progress tag-output timestamp-output tv use-hwthread-cpus "
    "use-regexp v verbose V version xml"
)
_MPIRUN_ONE_VALUE = (
    "am app bind-to c cartofile cf cpu-list cpu-set cpus-per-proc cpus-per-rank debugger "
    "default-hostfile h help H hnp host hostfile launch-agent machinefile map-by max-restarts "
    "max-vm-size n N np npernode npersocket ompi-server output-filename path personality ppr "
    "prefix preload-files rank-by rankfile report-events report-pid report-uri rf stdin timeout "
    "tune wd wdir x xml-file xterm"
)
MPIRUN_OPTION_VALUES = {
    **{name: 0 for name in _MPIRUN_FLAGS.split()},
    **{name: 1 for name in _MPIRUN_ONE_VALUE.split()},
    "mca": 2,
    "gmca": 2,
}
# Options whose say belongs to the launch plan: the hosts and process counts come from
# resourceconfig.json and the sagemaker_mpi_* keys, the other hosts are reached over our SSH
# configuration, and mpirun must run the training program.
_OWNED = {
    "the hosts are the job's own (resourceconfig.json)": "H host hostfile machinefile default-hostfile rankfile rf",
    "the number of processes is decided from sagemaker_mpi_num_processes and "
    "sagemaker_mpi_num_of_processes_per_host": "c n np N npernode pernode npersocket ppr max-vm-size",
    "how mpirun reaches the other hosts is the launcher's": "launch-agent prefix noprefix hnp dvm",
    "an appfile replaces the training program and every other option": "app",
    "mpirun would then not run the training program": "h help V version do-not-launch",
}
MPIRUN_OWNED_OPTIONS = {name: why for why, names in _OWNED.items() for name in names.split()}
MPIRUN_OWNED_MCA = {
    **{name: "the launcher reaches the other hosts with its own SSH configuration"
       for name in ("plm", "plm_rsh_agent", "orte_rsh_agent", "pls_rsh_agent", "plm_rsh_args",
                    "plm_rsh_no_tree_spawn", "orte_launch_agent", "orte_default_hostfile")},
    "orte_abort_on_non_zero_status": "a failed rank must end the job (the failure report relies on it)",
}
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # Unicode's category Cc
MCA_NAME = re.compile(r"[A-Za-z0-9_]+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Open MPI hands the MCA parameters of mpirun's command line to the other hosts' daemons
# through ssh, each value in double quotes on the remote shell's command line, where these
# characters would be interpreted ("$(...)" runs a command there).
MCA_SHELL_CHARACTERS = frozenset('"$`\\')


def _shown(token: str) -> str:
    return json.dumps(token[:60]) + ("…" if len(token) > 60 else "")


def parse_mpi_option_tokens(key: str, tokens: tuple[str, ...]) -> tuple[str, ...]:
    """tokens when mpirun would read every one of them as an option or an option's value,
    none of them a control character, an option the plan owns or one that would take the
    training program as its value; otherwise a JobDefinitionError naming the file and key."""
    where = f"The hyperparameter {key} in {HYPERPARAMETERS}"

    def refuse(problem: str) -> JobDefinitionError:
        return JobDefinitionError(f"{where} {problem}. These options go to mpirun ahead of the training "
                                  f"program, so they are refused.")

    for token in tokens:
        bad = CONTROL_CHARACTER.search(token)
        if bad is not None:
            raise refuse(f"has {_shown(token)}, which holds the control character U+{ord(bad.group()):04X}")
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name = token[2:] if token.startswith("--") else token[1:] if token.startswith("-") else None
        if not name:
            raise refuse(f"has {_shown(token)}, which is not an option and the value of no option before it: "
                         f"mpirun would run it as the program")
        if name not in MPIRUN_OPTION_VALUES:
            hint = (f"; to set the environment variable {name}, write -x {name}=VALUE"
                    if ENV_NAME.fullmatch(name) and name.isupper() else "")
            raise refuse(f"has {_shown(token)}, which is not an option of mpirun (Open MPI 4.1; an option's "
                         f"value goes in the next word, not after \"=\"){hint}")
        if name in MPIRUN_OWNED_OPTIONS:
            raise refuse(f"sets {token}, which the launcher decides: {MPIRUN_OWNED_OPTIONS[name]}")
        count = MPIRUN_OPTION_VALUES[name]
        values = tokens[i + 1:i + 1 + count]
        if len(values) < count:
            raise refuse(f"ends with {' '.join(tokens[i:])}, but {token} takes {count} value"
                         f"{'s' if count > 1 else ''}: mpirun would take the training program as "
                         f"{'its' if count == 1 else 'the missing'} value")
        if name in ("mca", "gmca"):
            param, value = values
            if not MCA_NAME.fullmatch(param):
                raise refuse(f"has {token} {_shown(param)}, which is not an MCA parameter name "
                             f"(letters, digits and '_')")
            if param in MPIRUN_OWNED_MCA:
                raise refuse(f"sets the MCA parameter {param}, which the launcher decides: {MPIRUN_OWNED_MCA[param]}")
            if MCA_SHELL_CHARACTERS & set(value):
                raise refuse(f"gives the MCA parameter {param} the value {_shown(value)}, which holds one of "
                             f"the characters \" $ ` \\: Open MPI passes it to the other hosts through a remote "
                             f"shell, which would interpret them")
        if name == "x" and not ENV_NAME.fullmatch(values[0].split("=", 1)[0]):
            raise refuse(f"has -x {_shown(values[0])}, which does not start with an environment variable "
                         f"name (-x NAME or -x NAME=VALUE)")
        i += 1 + count
    return tokens


def build_toolkit_nccl_debug(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """The sagemaker-training toolkit reads `--NCCL_DEBUG VALUE` (or `--NCCL_DEBUG=VALUE`) out of
    the custom options and passes `-x NCCL_DEBUG=VALUE` to mpirun; jobs written for it say so
    (AWS's examples do). The same here; mpirun itself has no such option."""
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--NCCL_DEBUG="):
            out += ["-x", "NCCL_DEBUG=" + token.split("=", 1)[1]]
        elif token == "--NCCL_DEBUG" and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            out += ["-x", "NCCL_DEBUG=" + tokens[i + 1]]
            i += 1
        else:
            out.append(token)
        i += 1
    return tuple(out)


def parse_mpi_options(key: str, value: Any) -> tuple[str, ...]:
    """A custom mpirun options hyperparameter (one string, split as a shell would) as argv
    words, checked by parse_mpi_option_tokens."""
    if not isinstance(value, str):
        raise JobDefinitionError(
            f"The hyperparameter {key} in {HYPERPARAMETERS} must be a string of mpirun options, but it is "
            f"{canonical_json(value)}."
        )
    try:
        tokens = tuple(shlex.split(value))
    except ValueError as exc:
        raise JobDefinitionError(
            f"The hyperparameter {key} in {HYPERPARAMETERS} cannot be split into mpirun options as a shell "
            f"would ({exc}: an unbalanced quote or a trailing backslash): {_shown(value)}."
        ) from None
    return parse_mpi_option_tokens(key, build_toolkit_nccl_debug(tokens))


# An SDK v3 ModelTrainer job's distribution (job/v3_definition.py reads it; decide/v3_launch.py
# maps the rest of the job onto the plan): its driver's launcher, its mpirun options checked
# as sagemaker_mpi_custom_mpi_options are.
V3_LAUNCHERS = {"script": "process", "command": "process", "torchrun": "torch_distributed", "mpi": "mpi"}
V3_MPI_OPTIONS_KEY = "MPI.mpi_additional_options"
# mpirun's total process count (Open MPI 4.1: -c, -np, -n, one dash or two). SDK v3 3.27's MPI
# driver passes one host's count, so v3 users add the job's total in mpi_additional_options.
PROCESS_COUNT_OPTIONS = frozenset({"c", "n", "np"})


def split_process_count_options(tokens: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """tokens without mpirun's total process count options, and those as (option, value) pairs
    ("" when no value follows), read as mpirun reads them: another option's values are skipped."""
    rest: list[str] = []
    counts: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name = token[2:] if token.startswith("--") else token[1:] if token.startswith("-") else ""
        if name in PROCESS_COUNT_OPTIONS:
            counts.append((token, tokens[i + 1] if i + 1 < len(tokens) else ""))
            i += 2
            continue
        step = 1 + MPIRUN_OPTION_VALUES.get(name, 0)
        rest += tokens[i:i + step]
        i += step
    return tuple(rest), tuple(counts)


def parse_v3_mpi_options(v3: V3Job) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(v3's mpirun options for our mpirun, its process count options): a JobDefinitionError for
    an option we refuse, for which v3's own drivers run the job (cli.decide_v3_fallback)."""
    options, counts = split_process_count_options(v3.mpi_options)
    try:
        return parse_mpi_option_tokens(V3_MPI_OPTIONS_KEY, build_toolkit_nccl_debug(options)), counts
    except JobDefinitionError as exc:  # its words name a hyperparameter: say what v3 calls it
        raise JobDefinitionError(str(exc).replace(f"The hyperparameter {V3_MPI_OPTIONS_KEY} in hyperparameters.json",
                                                  f"SDK v3's {V3_MPI_OPTIONS_KEY}")) from None


def parse_v3_counts(v3: V3Job, counts: tuple[tuple[str, str], ...]) -> tuple[int | None, tuple[str, int] | None]:
    """(processes per host, the `-np` the plan must equal) by the one rule for numbers; a
    JobDefinitionError (the job is refused, not given to v3's drivers) for a count that is not one."""
    per_host = v3.process_count_per_node
    if per_host is not None and parse_count(per_host, MAX_PROCESSES_PER_HOST) is None:
        what = {"torchrun": "Torchrun", "mpi": "MPI"}[v3.driver]
        raise JobDefinitionError(
            f"SDK v3's {what}(process_count_per_node=…) is {_shown(str(per_host))}: it must be a whole number from 1 "
            f"to {MAX_PROCESSES_PER_HOST} (the processes on each host), or left unset for one per GPU or NeuronCore "
            f"(one on a CPU host).")
    np_option: tuple[str, int] | None = None
    for option, raw in counts:
        number = parse_count(raw)
        if number is None:
            what = f"has {option} {_shown(raw)}, which is not" if raw else f"ends with {option} and no number after it:"
            raise JobDefinitionError(f"SDK v3's {V3_MPI_OPTIONS_KEY} {what} a whole number of at least 1 (the job's "
                                     f"total number of processes).")
        if np_option is not None and number != np_option[1]:
            raise JobDefinitionError(f"SDK v3's {V3_MPI_OPTIONS_KEY} sets {np_option[0]} {np_option[1]} and then "
                                     f"{option} {number}: give the job's total number of processes once, or not at all.")
        np_option = (option, number)
    return per_host, np_option


def decide_v3_distribution(v3: V3Job) -> Distribution:
    """Our Distribution for a v3 job; a JobDefinitionError for what we refuse."""
    options, counts = parse_v3_mpi_options(v3)
    per_host, np_option = parse_v3_counts(v3, counts)
    return Distribution(launcher=V3_LAUNCHERS[v3.driver], processes_per_host=per_host,
                        num_processes=None, custom_mpi_options=options, instance_groups=None,
                        notes=(f"SDK v3 ModelTrainer job ({describe_v3_job(v3)}): launched by this image",),
                        np_option=np_option)


def describe_v3_job(v3: V3Job) -> str:
    what = {"script": "no distributed", "command": "command=", "torchrun": "Torchrun()", "mpi": "MPI()"}[v3.driver]
    return what if v3.driver == "command" else f"{what}, {v3.entry_script}"


def parse_distribution(job: JobConfig) -> Distribution:
    if job.sdk_v3 is not None:  # an SDK v3 ModelTrainer job: its Torchrun()/MPI() (decide/v3_launch.py)
        return decide_v3_distribution(job.sdk_v3)
    framework: Mapping[str, Any] = job.hyperparameters.framework
    notes = check_framework_keys(framework)
    launcher = parse_launcher(framework)
    for key, launchers, what in ((MPI_PPH, MPI_BASED, "MPI"), (MPI_NP, MPI_BASED, "MPI"), (MPI_OPTIONS, MPI_BASED, "MPI"),
                                 (SMDDP_OPTIONS, ("smdataparallel",), "smdistributed dataparallel")):
        if key in framework and launcher not in launchers:
            raise JobDefinitionError(
                f"The hyperparameter {key} is set, but {what} is not enabled (the launcher is "
                f"{launcher}). Remove it, or enable {what}."
            )
    options: tuple[str, ...] = ()
    for key in (MPI_OPTIONS, SMDDP_OPTIONS):
        if key in framework:
            options += parse_mpi_options(key, framework[key])
    groups = parse_instance_groups(job, framework[GROUPS], notes) if GROUPS in framework else None
    return Distribution(
        launcher=launcher,
        processes_per_host=_as_count(MPI_PPH, framework[MPI_PPH], MAX_PROCESSES_PER_HOST) if MPI_PPH in framework else None,
        num_processes=_as_count(MPI_NP, framework[MPI_NP]) if MPI_NP in framework else None,
        custom_mpi_options=options,
        instance_groups=groups,
        notes=tuple(notes),
    )


def check_framework_keys(framework: Mapping[str, Any]) -> list[str]:
    """Refuse what this image does not run and a misspelt distribution key; the notes for the
    other keys it ignores."""
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
            import difflib  # only for this message: ~1 ms of every start-up otherwise

            close = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise JobDefinitionError(
                f"Unknown distribution hyperparameter {key}.{hint} Known keys: "
                f"{', '.join(sorted(KNOWN_KEYS - INFORMATIONAL_KEYS))}."
            )
        notes.append(f"ignoring unrecognised framework hyperparameter {key}")
    return notes


def parse_launcher(framework: Mapping[str, Any]) -> str:
    enabled = [name for name, key in ENABLE_KEYS.items() if key in framework and _as_bool(key, framework[key])]
    if len(enabled) > 1:
        keys = " and ".join(ENABLE_KEYS[name] for name in enabled)
        raise JobDefinitionError(
            f"The distribution settings contradict each other: {keys} are all enabled. "
            f"Enable exactly one launcher in the estimator's distribution= argument."
        )
    return enabled[0] if enabled else "process"


def parse_instance_groups(job: JobConfig, value: Any, notes: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(g, str) and g for g in value):
        raise JobDefinitionError(
            f"The hyperparameter {GROUPS} must be a list of instance group names, but it "
            f"is {canonical_json(value)}."
        )
    misread = [g for g in value if not GROUP_NAME.fullmatch(g)]
    if misread:
        raise JobDefinitionError(
            f"The hyperparameter {GROUPS} in {HYPERPARAMETERS} names {_shown(misread[0])}, which is not "
            f"an instance group name (letters, digits, '.', '_' and '-', not starting with '-')."
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
    return tuple(value)


def decide_launcher_kind(dist: Distribution, facts: MachineFacts) -> tuple[str, list[str]]:
    """The launcher that runs the job here: smdataparallel without AWS's SMDDP library runs
    with torchrun."""
    if dist.launcher == "smdataparallel" and not facts.smddprun:
        return "torch_distributed", [
            "smdistributed dataparallel requested but AWS's SMDDP library is not in this image; "
            "launching with torchrun instead (use backend \"nccl\", not \"smddp\", in the script)"]
    return dist.launcher, []

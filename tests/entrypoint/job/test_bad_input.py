"""Bad job definitions: one clear paragraph in output/failure, a non-zero exit, no traceback.
Property-based: no parser raises anything but JobDefinitionError, whatever the input."""

import json
import os
import subprocess

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from entrypoint.job.config import (
    parse_checkpoint_config,
    parse_hyperparameters,
    parse_input_data_config,
    parse_json_document,
    parse_resource_config,
)
from entrypoint.decide.distribution import (
    MPIRUN_OPTION_VALUES,
    MPIRUN_OWNED_MCA,
    MPIRUN_OWNED_OPTIONS,
    parse_distribution,
    parse_mpi_option_tokens,
    parse_mpi_options,
)
from entrypoint.decide.settings import parse_launch_settings
from entrypoint.errors import EXIT_BAD_JOB, JobDefinitionError
from entrypoint.job.paths import MlPaths
from support.jobs import make_job
from support.jobtree import PYTHON, entrypoint_env, failure_text, run_entrypoint, write_tree

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick


def corrupt(root, name, text):
    (root / "input/config" / name).write_text(text)


BAD_TREES = {
    "malformed-json": (lambda r: corrupt(r, "resourceconfig.json", '{"current_host": "algo-1", hosts: }'), "resourceconfig.json is not valid JSON"),
    "hosts-not-a-list": (lambda r: corrupt(r, "resourceconfig.json", '{"current_host": "algo-1", "hosts": "algo-1"}'), '"hosts" in resourceconfig.json must be a list'),
    "empty-hosts": (lambda r: corrupt(r, "resourceconfig.json", '{"current_host": "algo-1", "hosts": []}'), '"hosts" in resourceconfig.json is empty'),
    "current-host-unknown": (lambda r: corrupt(r, "resourceconfig.json", '{"current_host": "algo-9", "hosts": ["algo-1"]}'), 'current_host "algo-9" in resourceconfig.json is not one of its hosts'),
    "current-host-wrong-type": (lambda r: corrupt(r, "resourceconfig.json", '{"current_host": 1, "hosts": ["algo-1"]}'), '"current_host" in resourceconfig.json must be a non-empty string'),
    "hyperparameters-array": (lambda r: corrupt(r, "hyperparameters.json", "[1, 2]"), "hyperparameters.json must hold a JSON object, but it holds an array"),
    "missing-program-name": (lambda r: corrupt(r, "hyperparameters.json", "{}"), "No training program is named"),
    "program-file-missing": (lambda r: (r / "code/train.py").unlink(), "The training program train.py does not exist"),
    # Issue 33: a folder (or a FIFO) under the program's name was "does not exist".
    "program-is-a-folder": (lambda r: ((r / "code/train.py").unlink(), (r / "code/train.py").mkdir()),
                            "The training program train.py is a folder, not a file, in the source directory"),
    "program-is-a-fifo": (lambda r: ((r / "code/train.py").unlink(), os.mkfifo(r / "code/train.py")),
                          "The training program train.py is not a regular file (a FIFO, socket or device)"),
    "unsafe-program": (lambda r: corrupt(r, "hyperparameters.json", json.dumps({"sagemaker_program": '"../../etc/passwd"'})), "is not a plain relative path"),
    "channel-without-folder": (lambda r: corrupt(r, "inputdataconfig.json", '{"train": {"TrainingInputMode": "File"}}'), "names the channel(s) train, but"),
    "bad-input-mode": (lambda r: corrupt(r, "inputdataconfig.json", '{"train": {"TrainingInputMode": "Stream"}}'), 'TrainingInputMode "Stream"'),
    "missing-resourceconfig": (lambda r: (r / "input/config/resourceconfig.json").unlink(), "resourceconfig.json does not exist"),
    "bad-env-setting": (None, "BYOC_GRACE_PERIOD_S='soon'"),
    "host-name-is-an-option": (lambda r: corrupt(r, "resourceconfig.json", json.dumps(
        {"current_host": "algo-1", "hosts": ["algo-1", "-oProxyCommand=touch /tmp/pwned"]})),
        '"hosts" in resourceconfig.json has "-oProxyCommand=touch /tmp/pwned", which is not a host name'),
    "interface-with-a-space": (lambda r: corrupt(r, "resourceconfig.json", json.dumps(
        {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0 --foo"})),
        '"network_interface_name" in resourceconfig.json has "eth0 --foo", which is not a network interface name'),
    "mpi-option-that-takes-the-program": (lambda r: corrupt(r, "hyperparameters.json", json.dumps(
        {"sagemaker_program": '"train.py"', "sagemaker_mpi_enabled": "true",
         "sagemaker_mpi_custom_mpi_options": json.dumps("-verbose -x")})),
        "The hyperparameter sagemaker_mpi_custom_mpi_options in hyperparameters.json ends with -x, but -x takes 1 value"),
    "mpi-option-the-plan-owns": (lambda r: corrupt(r, "hyperparameters.json", json.dumps(
        {"sagemaker_program": '"train.py"', "sagemaker_mpi_enabled": "true",
         "sagemaker_mpi_custom_mpi_options": json.dumps("--mca plm_rsh_agent 'sh -c touch /tmp/pwned'")})),
        "The hyperparameter sagemaker_mpi_custom_mpi_options in hyperparameters.json sets the MCA parameter plm_rsh_agent"),
}


@pytest.mark.parametrize("case", sorted(BAD_TREES))
def test_bad_job_definition_is_one_clear_paragraph(tmp_path, case):
    root = write_tree(tmp_path, script="print('must not run')\n")
    breaker, expected = BAD_TREES[case]
    env = {}
    if breaker is None:
        env = {"BYOC_GRACE_PERIOD_S": "soon"}
    else:
        breaker(root)
    done = run_entrypoint(root, **env)
    assert done.returncode == EXIT_BAD_JOB
    report = failure_text(root)
    assert report.startswith("The training job definition is invalid: ")
    assert expected in report
    assert "Traceback" not in report and "Traceback" not in done.stderr
    assert report.count("\n") == 1 and len(report) < 1024
    assert "must not run" not in done.stdout


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
HOSTS = st.lists(st.sampled_from(["algo-1", "algo-2", "algo-10", "", 3]), max_size=4)
RESOURCE = st.fixed_dictionaries(
    {},
    optional={
        "current_host": st.sampled_from(["algo-1", "algo-2", "", None, 7]),
        "hosts": HOSTS | JSON,
        "instance_groups": st.lists(st.fixed_dictionaries({}, optional={"instance_group_name": st.sampled_from(["a", "b", 1]), "hosts": HOSTS, "instance_type": JSON}), max_size=3) | JSON,
        "current_group_name": st.sampled_from(["a", "b", None, 5]),
        "network_interface_name": JSON,
        "current_instance_type": JSON,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, RESOURCE))
def test_parse_resource_config_never_raises_anything_else(doc):
    try:
        config = parse_resource_config(doc)
    except JobDefinitionError as exc:
        assert str(exc)
    else:
        assert config.current_host in config.hosts


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, st.dictionaries(st.text(max_size=10), st.text(max_size=10) | JSON, max_size=6)))
def test_parse_hyperparameters_and_distribution_never_raise_anything_else(doc):
    try:
        hps = parse_hyperparameters(doc)
    except JobDefinitionError:
        return
    assert set(hps.values) == set(doc)


DIST_KEYS = st.sampled_from([
    "sagemaker_mpi_enabled", "sagemaker_torch_distributed_enabled", "sagemaker_parameter_server_enabled",
    "sagemaker_pytorch_ddp_enabled", "sagemaker_mpi_num_of_processes_per_host", "sagemaker_mpi_num_processes",
    "sagemaker_mpi_custom_mpi_options", "sagemaker_distribution_instance_groups", "sagemaker_mpi_enable", "sagemaker_whatever",
])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(DIST_KEYS, JSON | st.sampled_from(["true", "false", "2", "-x A 'unclosed"]), max_size=4))
def test_parse_distribution_never_raises_anything_else(hps):
    try:
        job = make_job(hps=hps)
        parse_distribution(job)
    except JobDefinitionError as exc:
        assert str(exc)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, st.dictionaries(st.text(max_size=10), st.one_of(JSON, st.fixed_dictionaries({}, optional={"TrainingInputMode": JSON | st.sampled_from(["File", "Pipe"]), "S3DistributionType": JSON, "ContentType": JSON})), max_size=4)))
def test_parse_input_data_config_never_raises_anything_else(doc):
    try:
        config = parse_input_data_config(doc)
    except JobDefinitionError:
        return
    assert all("/" not in c.name for c in config.channels)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40) | st.binary(max_size=20).map(lambda b: b.decode("latin1")))
def test_parse_json_document_never_raises_anything_else(text):
    try:
        parse_json_document(text, "x.json")
    except JobDefinitionError as exc:
        assert "x.json is not valid JSON" in str(exc)


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_parse_checkpoint_config_never_raises_anything_else(doc):
    try:
        config = parse_checkpoint_config(doc, MlPaths("/opt/ml"))
    except JobDefinitionError:
        return
    assert config.local_path


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["BYOC_MASTER_PORT", "BYOC_TORCHRUN_MAX_RESTARTS", "BYOC_GRACE_PERIOD_S", "BYOC_HOST_RESOLUTION_TIMEOUT_S"]), st.text(max_size=6)))
def test_parse_launch_settings_never_raises_anything_else(environ):
    try:
        parse_launch_settings(environ)
    except JobDefinitionError as exc:
        assert "environment variable" in str(exc)


def test_defaults_and_order_kept():
    config = parse_resource_config({"current_host": "algo-2", "hosts": ["algo-1", "algo-10", "algo-2"]})
    assert config.hosts == ("algo-1", "algo-10", "algo-2")
    assert (config.current_instance_type, config.current_group_name, config.network_interface_name) == ("local", "homogeneousCluster", "eth0")
    hps = parse_hyperparameters({"a": '"x"', "b": "[1, 2]", "c": "not json", "d": 5, "sagemaker_program": '"t.py"', "sagemaker_mpi_enabled": "true"})
    assert dict(hps.user) == {"a": "x", "b": [1, 2], "c": "not json", "d": 5}
    assert dict(hps.framework) == {"sagemaker_mpi_enabled": True}
    channels = parse_input_data_config({"train": {}})
    assert channels.channels[0].input_mode == "File" and channels.channels[0].distribution == "FullyReplicated"
    assert parse_checkpoint_config({}, MlPaths("/opt/ml")).local_path == "/opt/ml/checkpoints"


# --- values that reach an argv (ssh, mpirun, torchrun) -------------------------------------

ARGV_HOSTILE = st.one_of(
    st.text(min_size=1, max_size=20).map(lambda s: "-" + s),                       # read as an option
    st.tuples(st.text(max_size=8), st.sampled_from(" \t\n\r\x00\x1b\x7f"), st.text(max_size=8)).map("".join),
)


@settings(max_examples=200, deadline=None)
@given(bad=ARGV_HOSTILE)
def test_no_host_or_interface_that_an_argv_could_misread_gets_through(bad):
    for doc, key in (
        ({"current_host": "algo-1", "hosts": ["algo-1", bad]}, '"hosts"'),
        ({"current_host": bad, "hosts": [bad]}, '"hosts"'),
        ({"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": bad}, '"network_interface_name"'),
        ({"current_host": "algo-1", "hosts": ["algo-1"], "current_group_name": "g",
          "instance_groups": [{"instance_group_name": bad, "hosts": ["algo-1"]}]}, '"instance_group_name"'),
    ):
        with pytest.raises(JobDefinitionError) as err:
            parse_resource_config(doc)
        assert key in str(err.value) and "resourceconfig.json" in str(err.value)


@pytest.mark.parametrize("host", ["algo-1", "algo-12", "ip-10-0-1-23.ec2.internal", "node_3", "10.0.0.7"])
@pytest.mark.parametrize("interface", ["eth0", "ethwe", "ens5", "enp0s31f6", "veth1@if2"])
def test_real_host_and_interface_names_pass(host, interface):
    resource = parse_resource_config({"current_host": host, "hosts": [host], "network_interface_name": interface})
    assert resource.hosts == (host,) and resource.network_interface_name == interface


# --- custom mpirun options (sagemaker_mpi_custom_mpi_options and smdistributed's) ---------------
# They ARE options, so a leading "-" is expected; what must not get through: a control
# character, a word mpirun would run as the program, an option that takes the training program
# as its value, an option (or MCA parameter) the plan owns, a shell-active MCA value.

MPI_KEY = "sagemaker_mpi_custom_mpi_options"
PROGRAM = ("/usr/bin/python3", "/opt/ml/code/train.py", "--epochs", "2")


def mpirun_reads(argv: tuple[str, ...]) -> tuple[list[str], int]:
    """What mpirun (Open MPI 4.1) reads in argv: the words it takes as options (each one's values
    follow it, whatever they look like), and where it finds the program: the first word that is
    neither an option nor an option's value (a model of opal_cmd_line over mpirun's option table)."""
    options, i = [], 0
    while i < len(argv) and argv[i].startswith("-"):
        options.append(argv[i])
        i += 1 + MPIRUN_OPTION_VALUES.get(argv[i].lstrip("-"), 0)
    return options, i


def mpirun_reads_as_program(argv: tuple[str, ...]) -> int:
    return mpirun_reads(argv)[1]


def refused(tokens) -> str:
    with pytest.raises(JobDefinitionError) as err:
        parse_mpi_option_tokens(MPI_KEY, tuple(tokens))
    message = str(err.value)
    assert f"The hyperparameter {MPI_KEY} in hyperparameters.json " in message and "\n" not in message
    return message


FREE_OPTIONS = sorted(n for n in MPIRUN_OPTION_VALUES if n not in MPIRUN_OWNED_OPTIONS and n not in ("x", "mca", "gmca"))
SAFE_WORD = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="._:,^/=-+"), min_size=1, max_size=12)
ENV_WORD = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
MCA_PARAM = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True).filter(lambda p: p not in MPIRUN_OWNED_MCA)


@st.composite
def good_option(draw) -> list[str]:
    dashes = draw(st.sampled_from(["-", "--"]))
    kind = draw(st.sampled_from(["free", "x", "mca"]))
    if kind == "x":
        name = draw(ENV_WORD)
        return ["-x", draw(st.sampled_from([name, f"{name}={draw(SAFE_WORD)}"]))]
    if kind == "mca":
        return [dashes + draw(st.sampled_from(["mca", "gmca"])), draw(MCA_PARAM), draw(SAFE_WORD)]
    name = draw(st.sampled_from(FREE_OPTIONS))
    return [dashes + name] + [draw(SAFE_WORD) for _ in range(MPIRUN_OPTION_VALUES[name])]


GOOD_OPTIONS = st.lists(good_option(), max_size=5).map(lambda groups: [t for g in groups for t in g])


@pytest.mark.parametrize("options", [
    "", "-verbose -x NCCL_DEBUG=VERSION", "-x NCCL_DEBUG=INFO --mca btl_tcp_if_exclude lo",
    "--mca btl_vader_single_copy_mechanism none", "-x FI_EFA_USE_DEVICE_RDMA=1 -x NCCL_PROTO=simple",
    "--bind-to core --map-by socket --report-bindings", "-mca btl_tcp_if_include eth0 -mca pml ob1",
    "-x 'GREETING=hello world' --mca orte_base_help_aggregate 0 --timestamp-output", "--mca btl ^openib,ofi",
])  # fmt: skip
def test_real_custom_mpi_options_pass_as_written(options):
    import shlex

    assert parse_mpi_options(MPI_KEY, options) == tuple(shlex.split(options))


@settings(max_examples=300, deadline=None)
@given(GOOD_OPTIONS)
def test_well_formed_options_pass_and_mpirun_still_runs_the_training_program(tokens):
    assert parse_mpi_option_tokens(MPI_KEY, tuple(tokens)) == tuple(tokens)
    assert mpirun_reads_as_program((*tokens, *PROGRAM)) == len(tokens)


@settings(max_examples=300, deadline=None)
@given(GOOD_OPTIONS, st.sampled_from(sorted(n for n, count in MPIRUN_OPTION_VALUES.items() if count)), st.data())
def test_an_option_left_without_its_values_is_refused_not_fed_the_program(tokens, name, data):
    given_values = data.draw(st.lists(SAFE_WORD, max_size=MPIRUN_OPTION_VALUES[name] - 1))
    message = refused([*tokens, "--" + name, *given_values])
    if name not in MPIRUN_OWNED_OPTIONS:
        assert f"but --{name} takes {MPIRUN_OPTION_VALUES[name]} value" in message
        assert "mpirun would take the training program as" in message


@settings(max_examples=300, deadline=None)
@given(GOOD_OPTIONS, st.sampled_from(sorted(MPIRUN_OWNED_OPTIONS)), st.sampled_from(["-", "--"]), GOOD_OPTIONS)
def test_an_option_the_plan_owns_is_refused_wherever_it_is(before, name, dashes, after):
    values = ["4"] * MPIRUN_OPTION_VALUES[name]
    assert f"sets {dashes}{name}, which the launcher decides" in refused([*before, dashes + name, *values, *after])


@settings(max_examples=200, deadline=None)
@given(GOOD_OPTIONS, st.sampled_from(sorted(MPIRUN_OWNED_MCA)), st.sampled_from(["-mca", "--mca", "--gmca"]))
def test_an_mca_parameter_the_plan_owns_is_refused(tokens, param, option):
    assert f"sets the MCA parameter {param}, which the launcher decides" in refused([*tokens, option, param, "x"])


@settings(max_examples=300, deadline=None)
@given(GOOD_OPTIONS, st.data())
def test_a_control_character_anywhere_is_refused(tokens, data):
    tokens = tokens or ["-x", "A"]
    where = data.draw(st.integers(0, len(tokens) - 1))
    control = data.draw(st.sampled_from([chr(c) for c in (*range(0x20), 0x7F, 0x85, 0x9B)]))
    at = data.draw(st.integers(0, len(tokens[where])))
    tokens[where] = tokens[where][:at] + control + tokens[where][at:]
    assert f"which holds the control character U+{ord(control):04X}" in refused(tokens)


@settings(max_examples=300, deadline=None)
@given(GOOD_OPTIONS, SAFE_WORD.filter(lambda w: not w.startswith("-")) | st.just(""), GOOD_OPTIONS)
def test_a_word_mpirun_would_run_as_the_program_is_refused(before, word, after):
    assert "mpirun would run it as the program" in refused([*before, word, *after])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["-x", "--mca", "-np", "--host", "-verbose", "--app", "lo", "A=1", "", "-", "--",
                                 "btl", "plm_rsh_agent", "$(id)", "a\nb", "--bogus", "--np=2"]) | st.text(max_size=6),
                max_size=8))
@example(tokens=["--mca", "btl", "-x", "--mca", "0", "-np"])  # -x and -np are MCA values there, not options
def test_whatever_gets_through_leaves_mpirun_running_the_training_program(tokens):
    try:
        parse_mpi_option_tokens(MPI_KEY, tuple(tokens))
    except JobDefinitionError as exc:
        assert f"The hyperparameter {MPI_KEY} in hyperparameters.json " in str(exc)
        return
    options, program = mpirun_reads((*tokens, *PROGRAM))
    assert program == len(tokens)
    assert not any(o.lstrip("-") in MPIRUN_OWNED_OPTIONS for o in options)


@pytest.mark.parametrize("options, expected", [
    ("-x 'unclosed", "cannot be split into mpirun options as a shell would (No closing quotation"),
    ("-x A=1 \\", "cannot be split into mpirun options as a shell would (No escaped character"),
    ("--mca btl_tcp_if_include '$(touch /tmp/pwned)'", 'value "$(touch /tmp/pwned)", which holds one of the characters'),
    ("--mca 'bad name' x", 'has --mca "bad name", which is not an MCA parameter name'),
    ("-x -np", 'has -x "-np", which does not start with an environment variable name'),
    ("--NCCL_SOCKET_IFNAME eth0", 'has "--NCCL_SOCKET_IFNAME", which is not an option of mpirun (Open MPI 4.1; an option\'s '
                                  'value goes in the next word, not after "="); to set the environment variable '
                                  'NCCL_SOCKET_IFNAME, write -x NCCL_SOCKET_IFNAME=VALUE'),
    ("--NCCL_DEBUG", 'has "--NCCL_DEBUG", which is not an option of mpirun'),  # the toolkit's form needs its value
    ("--np=2", 'has "--np=2", which is not an option of mpirun'),
])  # fmt: skip
def test_mpi_option_strings_refused_with_the_reason(options, expected):
    with pytest.raises(JobDefinitionError) as err:
        parse_mpi_options(MPI_KEY, options)
    assert f"The hyperparameter {MPI_KEY} in hyperparameters.json " in str(err.value)
    assert expected in str(err.value)


def test_smdistributed_options_are_checked_too_and_reach_no_argv_unchecked():
    hps = {"sagemaker_distributed_dataparallel_enabled": True,
           "sagemaker_distributed_dataparallel_custom_mpi_options": "-x NCCL_DEBUG=INFO --hostfile /tmp/h"}
    with pytest.raises(JobDefinitionError) as err:
        parse_distribution(make_job(hps=hps))
    assert "sagemaker_distributed_dataparallel_custom_mpi_options in hyperparameters.json sets --hostfile" in str(err.value)
    hps["sagemaker_distributed_dataparallel_custom_mpi_options"] = "-x NCCL_DEBUG=INFO"
    assert parse_distribution(make_job(hps=hps)).custom_mpi_options == ("-x", "NCCL_DEBUG=INFO")


def test_an_instance_group_name_that_an_argv_could_misread_is_refused_even_without_groups():
    with pytest.raises(JobDefinitionError) as err:
        parse_distribution(make_job(hps={"sagemaker_mpi_enabled": True, "sagemaker_distribution_instance_groups": ["-H evil"]}))
    assert 'sagemaker_distribution_instance_groups in hyperparameters.json names "-H evil", which is not an instance group name' in str(err.value)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: not k.startswith("sagemaker")),
                       st.text(max_size=8) | st.sampled_from(["--nnodes", "-m", "--standalone"]), max_size=4))
def test_torchrun_reads_no_user_hyperparameter_as_its_own_option(user):
    """torchrun's argv from the job: host names and the leader (checked in config), numbers,
    then the script; user hyperparameters come only after the script, where torchrun hands
    every word to the script (argparse REMAINDER)."""
    from support.jobs import GPU4, plan_for

    torch = {"sagemaker_torch_distributed_enabled": True}
    hosts = ("algo-1", "algo-2")
    base = plan_for(make_job(hosts=hosts, hps=torch), GPU4).processes[0].argv
    argv = plan_for(make_job(hosts=hosts, hps={**torch, **user}), GPU4).processes[0].argv
    script = base.index("/opt/ml/code/train.py")
    assert argv[: script + 1] == base[: script + 1]


# --- launch errors: the kernel refuses to start the program ------------------------------------

LAUNCH_ERRORS = {
    "missing-#!-interpreter": (dict(program="train.sh", script="#!/nonexistent/bash\necho must not run\n"),
                               "train.sh: could not start /nonexistent/bash (the interpreter named on the program's #! line): no such file"),
    "NUL-in-a-hyperparameter": (dict(hyperparameters={"a": "x\x00y"}),
                                "a NUL byte in argument 4 (the value of -a), environment variable SM_HP_A (the kernel cannot pass one)"),
    "=-in-a-hyperparameter-name": (dict(hyperparameters={"a=b": 1}),
                                   "environment variable name(s) 'SM_HP_A=B' cannot be passed to a process"),
    "argv-and-environment-too-large": (dict(hyperparameters={"a": "x" * 3_000_000}),
                                       "are too large for the kernel (E2BIG); the largest: environment variable SM_TRAINING_ENV"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(LAUNCH_ERRORS))
def test_a_program_the_kernel_will_not_start_is_one_clear_line_not_a_traceback(tmp_path, case):
    kwargs, expected = LAUNCH_ERRORS[case]
    root = write_tree(tmp_path, **{"script": "print('must not run')\n", **kwargs})
    if kwargs.get("program", "").endswith(".sh"):
        (root / "code" / kwargs["program"]).chmod(0o755)
    done = run_entrypoint(root)
    assert done.returncode == EXIT_BAD_JOB, done.stderr[-2000:]
    report = failure_text(root)
    assert expected in report
    assert report.count("\n") <= 1 and len(report) < 1024
    assert "Traceback" not in report and "Traceback" not in done.stderr
    assert "must not run" not in done.stdout


def test_launch_error_descriptions_for_what_the_kernel_says():
    import errno

    from entrypoint.outcome.launch_errors import describe_launch_error

    argv, env = ["/opt/ml/code/train"], {"PATH": "/bin"}
    assert describe_launch_error(argv, env, PermissionError(errno.EACCES, "denied")) == (
        "could not start /opt/ml/code/train: permission denied (is it executable? chmod +x)")
    assert "not a program this machine can run" in describe_launch_error(argv, env, OSError(errno.ENOEXEC, "x"))
    assert describe_launch_error(argv, env, FileNotFoundError(errno.ENOENT, "x")) == (
        "could not start /opt/ml/code/train: no such file")
    # E2BIG names the biggest values, whatever they are.
    big = describe_launch_error(["prog", "y" * 200_000], {"SMALL": "1", "BIG": "z" * 50_000}, OSError(errno.E2BIG, "x"))
    assert "the largest: argument 1 (200,001 bytes), environment variable BIG (50,005 bytes)" in big


# --- configuration files too deep or too large: a clear error, bounded memory ----------------

def test_a_configuration_file_nested_too_deeply_is_a_clear_error(tmp_path):
    root = write_tree(tmp_path, script="print('must not run')\n")
    corrupt(root, "inputdataconfig.json", "[" * 100_000 + "]" * 100_000)
    done = run_entrypoint(root)
    assert done.returncode == EXIT_BAD_JOB
    report = failure_text(root)
    assert "inputdataconfig.json is nested too deeply" in report
    assert "Traceback" not in done.stderr and "must not run" not in done.stdout


def test_a_configuration_file_larger_than_sagemaker_writes_is_refused_unread(tmp_path):
    from entrypoint.job.config import MAX_CONFIG_BYTES

    root = write_tree(tmp_path, script="print('must not run')\n")
    with open(root / "input/config/hyperparameters.json", "w") as f:
        f.write('{"sagemaker_program": "\\"train.py\\"", "x": "' + "a" * (MAX_CONFIG_BYTES + 10) + '"}')
    done = run_entrypoint(root)
    assert done.returncode == EXIT_BAD_JOB
    assert "hyperparameters.json is larger than 16 MiB" in failure_text(root)
    assert "Traceback" not in done.stderr


def test_deep_values_inside_a_hyperparameter_or_a_ranks_output_are_just_text():
    from entrypoint.job.config import decode_hyperparameter
    from entrypoint.hosts.job_port import parse_root_cause_line

    deep = "[" * 100_000 + "]" * 100_000
    assert decode_hyperparameter(deep) == deep  # the toolkit's rule: not JSON, so the raw value
    from entrypoint.hosts.job_port import ROOT_CAUSE as MARKER

    assert parse_root_cause_line("noise " + MARKER + deep) is None


@pytest.mark.parametrize("damage", ["truncated", "not-an-archive"])
def test_a_corrupt_source_archive_is_a_clear_error_naming_it(tmp_path, damage):
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        body = ("print('must not run')\n" + "# padding\n" * 5000).encode()
        info = tarfile.TarInfo("train.py")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    data = buf.getvalue()
    archive = tmp_path / "sourcedir.tar.gz"
    archive.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x1f\x8b\x08\x00 not gzip at all")
    root = write_tree(tmp_path / "ml", hyperparameters={"sagemaker_submit_directory": str(archive)})
    done = run_entrypoint(root)
    assert done.returncode == EXIT_BAD_JOB
    report = failure_text(root)
    assert f"sagemaker_submit_directory {archive} is not a readable tar archive" in report
    assert "Traceback" not in done.stderr and "must not run" not in done.stdout


# --- /opt/ml/output read-only or full: the exit code stays right, the reason goes to stderr ---

@pytest.mark.parametrize("output", ["read-only", "full"])
@pytest.mark.parametrize("script_exit", [0, 3])
def test_an_unwritable_output_folder_keeps_the_exit_code_and_logs_the_reason(tmp_path, output, script_exit):
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None or subprocess.run(
            ["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root and unshare(1) allowed (not in an unprivileged container): the output "
                    "folder is a tmpfs in a private mount namespace")
    root = write_tree(tmp_path, script=f"import sys\nprint('the script ran')\nsys.exit({script_exit})\n")
    out = root / "output"
    mount = ("mount -t tmpfs -o ro,size=64k tmpfs \"$OUT\"" if output == "read-only" else
             "mount -t tmpfs -o size=64k tmpfs \"$OUT\" && (cat /dev/zero > \"$OUT/filler\" 2>/dev/null; true)")
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         f"{mount} && exec \"$0\" -m entrypoint train", PYTHON],
        env={**entrypoint_env(root), "OUT": str(out)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == script_exit, done.stderr[-2000:]
    assert "the script ran" in done.stdout
    assert "Traceback" not in done.stderr
    what = "success" if script_exit == 0 else "failure"
    if output == "read-only" or script_exit:  # an empty success file still fits a full disk
        assert f"cannot write {out}/{what}: " in done.stderr
    if script_exit:
        assert "the job's exit code is 3; its reason: train.py failed on host algo-1 with exit code 3." in done.stderr


def test_output_that_is_not_utf8_still_gives_a_readable_failure_reason(tmp_path):
    script = ("import os, sys\nsys.stderr.buffer.write(b'loss went \\xff\\xfe bad in \\xc3(\\n')\n"
              "open(os.path.join(os.environ['SM_MODEL_DIR'], b'bad-\\xff-name'.decode('utf-8', 'surrogateescape')), 'w').close()\n"
              "raise SystemExit(3)\n")  # fmt: skip
    root = write_tree(tmp_path, script=script)
    done = subprocess.run([PYTHON, "-m", "entrypoint", "train"], env=entrypoint_env(root), capture_output=True, timeout=120)
    assert done.returncode == 3
    report = failure_text(root)
    assert "train.py failed on host algo-1 with exit code 3." in report
    assert "loss went \ufffd\ufffd bad in \ufffd(" in report  # the bytes replaced, the line kept
    assert b"Traceback" not in done.stderr


@pytest.mark.parametrize("options, expected", [
    ("--NCCL_DEBUG WARN", ("-x", "NCCL_DEBUG=WARN")),
    ("--NCCL_DEBUG=INFO -verbose", ("-x", "NCCL_DEBUG=INFO", "-verbose")),
    ("-x FOO=1 --NCCL_DEBUG INFO --mca btl_tcp_if_exclude lo", ("-x", "FOO=1", "-x", "NCCL_DEBUG=INFO", "--mca", "btl_tcp_if_exclude", "lo")),
])  # fmt: skip
def test_the_toolkits_nccl_debug_option_becomes_an_environment_variable(options, expected):
    """sagemaker-training reads --NCCL_DEBUG out of the custom options and gives mpirun
    -x NCCL_DEBUG=...; jobs written for it keep working."""
    assert parse_mpi_options(MPI_KEY, options) == expected

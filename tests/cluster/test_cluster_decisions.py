"""Run decisions, reports, argv and environment by value (pure, no machine)."""

import pytest

from localcluster.cli import build_parser, build_run_config
from localcluster.jobenv import build_job_environment
from localcluster.optml import Channel, InstanceGroupSpec
from localcluster.outcome import ClusterResult, build_summary, decide_stop_reason
from localcluster.processes import HostResult, build_nsenter_argv, describe_returncode
from localcluster.registry import decide_stale
from localcluster.requirements import ROOT_MESSAGE, build_requirement_problems
from localcluster.rootless import build_reexec_argv, parse_uid_map_is_initial

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick


@pytest.mark.parametrize(
    "codes, elapsed, timeout, fail_fast, expected",
    [
        ({"algo-1": None, "algo-2": None}, 1, None, True, None),
        ({"algo-1": 0, "algo-2": None}, 1, None, True, None),  # a finished host waits for the rest
        ({"algo-1": None, "algo-2": 3}, 1, None, True, "algo-2 failed"),
        ({"algo-1": None, "algo-2": -9}, 1, None, True, "algo-2 failed"),
        ({"algo-1": None, "algo-2": 3}, 1, None, False, None),
        ({"algo-1": None, "algo-2": 0}, 5, 5, True, "the job ran past its 5 s limit"),
        ({"algo-1": None, "algo-2": 0}, 4.9, 5, True, None),
        ({"algo-1": 1, "algo-2": 0}, 99, 5, True, None),  # all done: nothing to stop
    ],
)
def test_decide_stop_reason(codes, elapsed, timeout, fail_fast, expected):
    assert decide_stop_reason(codes, elapsed, timeout, fail_fast) == expected


def test_describe_returncode():
    assert describe_returncode(0) == "exit 0"
    assert describe_returncode(3) == "exit 3"
    assert describe_returncode(-9) == "killed by SIGKILL"
    assert describe_returncode(-15) == "killed by SIGTERM"


def test_summary_of_a_failed_job():
    result = ClusterResult(
        results={
            "algo-1": HostResult("algo-1", -15, "start\n", 2.04),
            "algo-2": HostResult("algo-2", 1, "start\nTraceback (most recent call last):\nValueError: bad\n", 1.5),
        },
        stop_reason="algo-2 failed",
        seconds=2.1,
    )
    assert build_summary(result, {"algo-2": "ValueError: bad\n"}) == "\n".join(
        [
            "localcluster: job finished in 2.1 s",
            "localcluster: stopped the hosts still running: algo-2 failed",
            "  algo-1  killed by SIGTERM  (2.0 s)",
            "  algo-2  exit 1  (1.5 s)",
            "--- algo-1: last 1 lines of output",
            "start",
            "--- algo-2: /opt/ml/output/failure",
            "ValueError: bad",
            "--- algo-2: last 3 lines of output",
            "start",
            "Traceback (most recent call last):",
            "ValueError: bad",
            "localcluster: 2 of 2 hosts failed",
        ]
    )
    assert result.failed == ["algo-1", "algo-2"] and not result.ok


def test_summary_of_a_good_job():
    result = ClusterResult({"algo-1": HostResult("algo-1", 0, "x\n", 1.0)}, None, 1.0)
    assert result.ok
    assert build_summary(result).splitlines()[-1] == "localcluster: all 1 hosts succeeded"


def test_nsenter_argv_golden():
    assert build_nsenter_argv(4242, ["python3", "-m", "entrypoint", "train"], "/opt/ml/code") == [
        "nsenter", "-t", "4242", "-n", "-u", "-i", "-m", "-p", "--wdns=/opt/ml/code",
        "--", "python3", "-m", "entrypoint", "train",
    ]  # fmt: skip


def test_job_environment_is_clean_like_a_container():
    env = build_job_environment("algo-2", "/repo/.venv/bin", "smoke", additions={"FOO": "1"})
    assert env == {
        "PATH": "/repo/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "HOSTNAME": "algo-2",
        "PYTHONUNBUFFERED": "1",
        "TRAINING_JOB_NAME": "smoke",
        "FOO": "1",
    }
    assert build_job_environment("a", "/b", "j", region="eu-west-1")["AWS_REGION"] == "eu-west-1"
    with pytest.raises(TypeError):
        build_job_environment("a", "/b", "j", additions={"N": 1})


def test_requirement_problems():
    assert build_requirement_problems(0, []) == []
    problems = build_requirement_problems(1000, ["nsenter"])
    assert problems == [ROOT_MESSAGE, "`nsenter` not found on PATH (Debian package util-linux)"]
    for needed in ("CAP_NET_ADMIN", "CAP_SYS_ADMIN", "/etc/netns", "user.max_user_namespaces", "sudo"):
        assert needed in ROOT_MESSAGE


def test_user_namespace_detection_and_reexec_argv():
    assert parse_uid_map_is_initial("         0          0 4294967295\n")
    assert not parse_uid_map_is_initial("         0       1000          1\n")
    assert build_reexec_argv("/usr/bin/python3", ["run", "--hosts", "2"]) == [
        "unshare", "--user", "--map-root-user", "--net", "--mount", "--propagation", "private",
        "--", "/usr/bin/python3", "-m", "localcluster", "run", "--hosts", "2",
    ]  # fmt: skip


def test_decide_stale():
    records = [{"id": "aaaaaa"}, {"id": "bbbbbb"}]
    assert decide_stale(records, {"aaaaaa": True, "bbbbbb": False}) == [{"id": "bbbbbb"}]


def _config(*argv, hp_file=None):
    args = build_parser().parse_args(["run", *argv])
    return build_run_config(args, hp_file, "/venv/bin/python")


def test_cli_default_command_is_the_container_command():
    config = _config("--hosts", "3")
    assert config.hosts == ("algo-1", "algo-2", "algo-3")
    assert config.command == ("/venv/bin/python", "-m", "entrypoint", "train")
    assert config.fail_fast and config.timeout is None and config.grace == 10.0


def test_cli_full_job(tmp_path):
    config = _config(
        "--host-names", "algo-1,algo-2,algo-10",
        "--code", "/src", "--program", "train.py",
        "--hp", "epochs=2", "--hp", "lr=0.5",
        "--channel", "train=/data/train",
        "--distribution", "mpi", "--processes-per-host", "2",
        "--instance-groups", "a:2,b:1", "--distribution-instance-groups", "a",
        "--env", "NCCL_DEBUG=INFO", "--timeout", "60", "--no-fail-fast",
        "--", "bash", "-c", "echo $HOSTNAME",
        hp_file='{"epochs": 1, "batch": 8}',
    )  # fmt: skip
    assert config.hosts == ("algo-1", "algo-2", "algo-10")
    assert config.command == ("bash", "-c", "echo $HOSTNAME")
    assert config.env == {"NCCL_DEBUG": "INFO"}
    assert config.timeout == 60 and not config.fail_fast
    job = config.job
    assert job.hyperparameters == {"epochs": 2, "batch": 8, "lr": 0.5}  # --hp wins over the file
    assert (job.code_dir, job.program, job.distribution, job.processes_per_host) == ("/src", "train.py", "mpi", 2)
    assert job.channels == (Channel("train", "/data/train"),)
    assert job.instance_groups == (InstanceGroupSpec("a", 2), InstanceGroupSpec("b", 1))
    assert job.distribution_instance_groups == ("a",)


def test_cli_bad_input():
    with pytest.raises(ValueError, match="--hp must look like NAME=VALUE"):
        _config("--hp", "oops")
    with pytest.raises(ValueError, match="invalid host name"):
        _config("--host-names", "ALGO")
    with pytest.raises(SystemExit):
        _config("--distribution", "horovod")

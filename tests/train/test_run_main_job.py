"""The main job runner's decisions (pure): what the SDK v2 estimator is given."""

import json

from jobs.main_job import DEFAULT_HYPERPARAMETERS, ENTRY_SCRIPT
from jobs.run_main_job import SDK_V2_SCRIPT, build_sdk_argv, decide_model_member, decide_sdk_distribution, parse_exports


def test_distribution_per_backend_is_what_a_user_writes():
    assert decide_sdk_distribution("ddp", 1) == {"torch_distributed": {"enabled": True}}
    assert decide_sdk_distribution("horovod", 2) == {"mpi": {"enabled": True, "processes_per_host": 2}}
    assert decide_sdk_distribution("mpi4py", 1) == {"mpi": {"enabled": True, "processes_per_host": 1}}
    assert decide_sdk_distribution("ps", 1) == {"parameter_server": {"enabled": True}}


def test_sdk_argv_names_image_code_channels_and_hyperparameters():
    argv = build_sdk_argv("/v/python", "img:t", "/w/code", {"train": "/w/t", "validation": "/w/v"}, 2, "ddp", 1,
                          "/w/root", "/w/r.json")
    assert argv[:2] == ["/v/python", str(SDK_V2_SCRIPT)]
    pairs = dict(zip(argv[2::2], argv[3::2]))
    assert pairs["--image"] == "img:t" and pairs["--entry-point"] == ENTRY_SCRIPT and pairs["--instance-count"] == "2"
    assert json.loads(pairs["--hyperparameters"]) == DEFAULT_HYPERPARAMETERS
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--channel"] == ["train=/w/t", "validation=/w/v"]


def test_model_member_and_docker_exports():
    assert decide_model_member("/opt/ml/model/model.pt") == "model.pt"
    assert parse_exports("export DOCKER_HOST=unix:///var/run/docker.sock\n") == {"DOCKER_HOST": "unix:///var/run/docker.sock"}


def test_result_line_under_mpirun_tag_output_in_a_tty():
    from jobs.run_main_job import RESULT

    line = "x-algo-1-ab | [1,0]<stdout>:[result] validation_accuracy=0.9944 model=/opt/ml/model/model.pt[1,0]<stdout>:"
    found = RESULT.search(line)
    assert (found["acc"], found["model"]) == ("0.9944", "/opt/ml/model/model.pt")


def test_work_dir_moves_out_of_folders_sdk_local_mode_refuses():
    """A checkout under /root (root's home) is refused by SDK v2 local mode ("does not
    support mounting from restricted system paths"): the main job works elsewhere then."""
    from jobs.run_main_job import FALLBACK_WORK, decide_work_dir

    assert decide_work_dir(None, "/work/main", "/root") == "/work/main/.work/main-job"
    assert decide_work_dir(None, "/root/project", "/root") == FALLBACK_WORK
    assert decide_work_dir(None, "/home/u/.config/x", "/home/u") == FALLBACK_WORK
    assert decide_work_dir(None, "/home/u/src", "/home/u") == "/home/u/src/.work/main-job"
    assert decide_work_dir("/srv/job", "/root/project", "/root") == "/srv/job"


def test_a_refused_work_dir_is_an_error_that_says_why():
    import pytest

    from jobs.run_main_job import decide_work_dir

    with pytest.raises(SystemExit, match=r"--work /root/job: SageMaker SDK local mode refuses code and data under /root"):
        decide_work_dir("/root/job", "/work", "/root")


def test_restricted_paths_are_the_installed_sdks():
    """Our copy of the SDK's list must follow the SDK pinned in pyproject (sdk-v2 extra)."""
    import os
    import subprocess

    from jobs.run_main_job import SDK_V2_PYTHON, build_sdk_restricted_paths

    probe = "import json, sagemaker.utils as u; print(json.dumps(u._SENSITIVE_SYSTEM_PATHS))"
    done = subprocess.run([str(SDK_V2_PYTHON), "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SAGEMAKER_SUPPRESS_V2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    sdk = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(sdk) == sorted(build_sdk_restricted_paths(os.path.expanduser("~")))

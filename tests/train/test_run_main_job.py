"""The main job runner's decisions (pure): what the SDK v2 estimator is given."""

import json

from train.main_job import DEFAULT_HYPERPARAMETERS, ENTRY_SCRIPT
from train.run_main_job import SDK_V2_SCRIPT, build_sdk_argv, decide_model_member, decide_sdk_distribution, parse_exports


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
    from train.run_main_job import RESULT

    line = "x-algo-1-ab | [1,0]<stdout>:[result] validation_accuracy=0.9944 model=/opt/ml/model/model.pt[1,0]<stdout>:"
    found = RESULT.search(line)
    assert (found["acc"], found["model"]) == ("0.9944", "/opt/ml/model/model.pt")

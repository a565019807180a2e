"""/opt/ml file contents and mounts by value (pure, no machine)."""

import json

import pytest

from localcluster.optml import (
    Channel,
    InstanceGroupSpec,
    JobSpec,
    Mount,
    WorkdirLayout,
    build_config_files,
    build_host_directories,
    build_hyperparameters,
    build_input_data_config,
    build_instance_groups,
    build_job_mounts,
    build_private_mounts,
    build_resource_config,
    parse_channel_assignments,
    parse_hyperparameter_assignments,
    parse_hyperparameters_json,
    parse_instance_groups_spec,
    validate_job,
)

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

HOSTS3 = ("algo-1", "algo-2", "algo-3")


def test_resource_config_homogeneous():
    groups = build_instance_groups(JobSpec(), ("algo-1", "algo-2"))
    assert build_resource_config("algo-2", ("algo-1", "algo-2"), groups) == {
        "current_host": "algo-2",
        "current_instance_type": "local",
        "current_group_name": "homogeneousCluster",
        "hosts": ["algo-1", "algo-2"],
        "instance_groups": [
            {"instance_group_name": "homogeneousCluster", "instance_type": "local", "hosts": ["algo-1", "algo-2"]}
        ],
        "network_interface_name": "eth0",
    }


def test_resource_config_lists_hosts_sorted_as_strings():
    names = ("algo-1", "algo-2", "algo-10")
    config = build_resource_config("algo-10", names, build_instance_groups(JobSpec(), names))
    assert config["hosts"] == ["algo-1", "algo-10", "algo-2"]
    assert config["instance_groups"][0]["hosts"] == ["algo-1", "algo-10", "algo-2"]


def test_resource_config_heterogeneous():
    job = JobSpec(instance_groups=parse_instance_groups_spec("train:2:ml.p4d.24xlarge,data:1:ml.c5.18xlarge"))
    groups = build_instance_groups(job, HOSTS3)
    assert build_resource_config("algo-3", HOSTS3, groups) == {
        "current_host": "algo-3",
        "current_instance_type": "ml.c5.18xlarge",
        "current_group_name": "data",
        "hosts": ["algo-1", "algo-2", "algo-3"],
        "instance_groups": [
            {"instance_group_name": "train", "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-1", "algo-2"]},
            {"instance_group_name": "data", "instance_type": "ml.c5.18xlarge", "hosts": ["algo-3"]},
        ],
        "network_interface_name": "eth0",
    }


@pytest.mark.parametrize(
    "spec, message",
    [
        ("train", "NAME:COUNT"),
        ("train:x", "COUNT must be a number"),
        ("train:0", "at least 1"),
        ("a:1,a:1", "unique"),
        (",", "empty"),
    ],
)
def test_bad_instance_group_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_instance_groups_spec(spec)


def test_instance_groups_must_cover_every_host():
    job = JobSpec(instance_groups=(InstanceGroupSpec("train", 2),))
    with pytest.raises(ValueError, match="add up to 2 hosts but the cluster has 3"):
        validate_job(job, HOSTS3)


def test_hyperparameters_are_json_encoded_like_the_sdk():
    job = JobSpec(
        job_name="smoke",
        hyperparameters={"epochs": 3, "lr": 0.1, "name": "abc", "flag": True, "layers": [1, 2], "quoted": "3"},
        program="train.py",
        code_dir="/src",
    )
    assert build_hyperparameters(job) == {
        "sagemaker_program": '"train.py"',
        "sagemaker_submit_directory": '"/opt/ml/code"',
        "sagemaker_container_log_level": "20",
        "sagemaker_job_name": '"smoke"',
        "epochs": "3",
        "lr": "0.1",
        "name": '"abc"',
        "flag": "true",
        "layers": "[1, 2]",
        "quoted": '"3"',
    }


@pytest.mark.parametrize(
    "distribution, ppn, expected",
    [
        ("none", None, {}),
        ("mpi", None, {"sagemaker_mpi_enabled": "true", "sagemaker_mpi_custom_mpi_options": '""'}),
        (
            "mpi",
            4,
            {
                "sagemaker_mpi_enabled": "true",
                "sagemaker_mpi_num_of_processes_per_host": "4",
                "sagemaker_mpi_custom_mpi_options": '""',
            },
        ),
        ("torch_distributed", None, {"sagemaker_torch_distributed_enabled": "true", "sagemaker_instance_type": '"local"'}),
        ("pytorchddp", None, {"sagemaker_pytorch_ddp_enabled": "true", "sagemaker_instance_type": '"local"'}),
        ("parameter_server", None, {"sagemaker_parameter_server_enabled": "true"}),
    ],
)
def test_distribution_hyperparameters(distribution, ppn, expected):
    hps = build_hyperparameters(JobSpec(distribution=distribution, processes_per_host=ppn))
    base = {"sagemaker_container_log_level", "sagemaker_job_name"}
    assert {k: v for k, v in hps.items() if k not in base} == expected


def test_processes_per_host_only_with_mpi():
    with pytest.raises(ValueError, match="only means something with --distribution mpi"):
        build_hyperparameters(JobSpec(distribution="torch_distributed", processes_per_host=2))


def test_user_values_win_over_sdk_keys_and_distribution_groups():
    job = JobSpec(
        hyperparameters={"sagemaker_mpi_custom_mpi_options": "-x FOO"},
        distribution="mpi",
        instance_groups=parse_instance_groups_spec("train:2,data:1"),
        distribution_instance_groups=("train",),
    )
    validate_job(job, HOSTS3)
    hps = build_hyperparameters(job)
    assert hps["sagemaker_mpi_custom_mpi_options"] == '"-x FOO"'
    assert hps["sagemaker_distribution_instance_groups"] == '["train"]'
    with pytest.raises(ValueError, match="'gpu' is not one of"):
        validate_job(JobSpec(instance_groups=job.instance_groups, distribution_instance_groups=("gpu",)), HOSTS3)


def test_input_data_config_like_local_mode():
    channels = (Channel("train", "/data/train"), Channel("test", None, content_type="text/csv"))
    assert build_input_data_config(channels) == {
        "train": {"TrainingInputMode": "File"},
        "test": {"TrainingInputMode": "File", "ContentType": "text/csv"},
    }


def test_config_files_for_one_host():
    files = build_config_files(JobSpec(hyperparameters={"a": 1}), "algo-2", ("algo-1", "algo-2"))
    assert sorted(files) == [
        "input/config/hyperparameters.json",
        "input/config/inputdataconfig.json",
        "input/config/resourceconfig.json",
    ]
    assert json.loads(files["input/config/resourceconfig.json"])["current_host"] == "algo-2"
    assert json.loads(files["input/config/hyperparameters.json"])["a"] == "1"


def test_cli_style_hyperparameters_and_channels():
    assert parse_hyperparameter_assignments(["epochs=3", "name=abc", "q=\"3\"", "lst=[1,2]", "eq=a=b", "e="]) == {
        "epochs": 3,
        "name": "abc",
        "q": "3",
        "lst": [1, 2],
        "eq": "a=b",
        "e": "",
    }
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_hyperparameter_assignments(["epochs"])
    assert parse_hyperparameters_json('{"a": [1]}', "hp.json") == {"a": [1]}
    with pytest.raises(ValueError, match="hp.json: expected a JSON object"):
        parse_hyperparameters_json("[1]", "hp.json")
    assert parse_channel_assignments(["train=/d/train"]) == (Channel("train", "/d/train"),)
    with pytest.raises(ValueError, match="given twice"):
        parse_channel_assignments(["train=/a", "train=/b"])
    with pytest.raises(ValueError, match="invalid channel name"):
        parse_channel_assignments(["a/b=/a"])


def test_mounts_make_model_code_and_channels_shared():
    layout = WorkdirLayout("/w")
    job = JobSpec(code_dir="/src", channels=(Channel("train", "/data/train"), Channel("eval")))
    assert build_job_mounts(job, layout, "algo-2") == (
        Mount("/w/hosts/algo-2/opt-ml", "/opt/ml"),
        Mount("/w/shared/model", "/opt/ml/model"),
        Mount("/src", "/opt/ml/code"),
        Mount("/w/shared/shared", "/opt/ml/shared"),
        Mount("/data/train", "/opt/ml/input/data/train"),
        Mount("/w/shared/data/eval", "/opt/ml/input/data/eval"),
    )
    assert build_host_directories(job) == (
        "input/config", "input/data", "output/data", "model", "code",
        "input/data/train", "input/data/eval", "shared",
    )  # fmt: skip


def test_private_mounts_keep_ssh_and_environment_off_the_machine():
    layout = WorkdirLayout("/w")
    assert build_private_mounts(layout, "algo-1") == (
        Mount("/w/hosts/algo-1/private/etc-ssh", "/etc/ssh"),
        Mount("/w/hosts/algo-1/private/root-ssh", "/root/.ssh"),
        Mount("/w/hosts/algo-1/private/environment", "/etc/environment", is_dir=False),
    )
    assert build_private_mounts(layout, "algo-1", with_etc_ssh=False, with_root_ssh=False) == (
        Mount("/w/hosts/algo-1/private/environment", "/etc/environment", is_dir=False),
    )
    # A container's root has no shell start-up files: the machine's ~/.bashrc (pyenv here)
    # stays out of every command sshd runs on an emulated host.
    assert build_private_mounts(layout, "algo-1", with_root_bashrc=True) == (
        Mount("/w/hosts/algo-1/private/etc-ssh", "/etc/ssh"),
        Mount("/w/hosts/algo-1/private/root-ssh", "/root/.ssh"),
        Mount("/w/hosts/algo-1/private/root-bashrc", "/root/.bashrc", is_dir=False),
        Mount("/w/hosts/algo-1/private/environment", "/etc/environment", is_dir=False),
    )


def test_relative_paths_are_refused():
    with pytest.raises(ValueError, match="absolute"):
        validate_job(JobSpec(code_dir="src"), ("algo-1",))

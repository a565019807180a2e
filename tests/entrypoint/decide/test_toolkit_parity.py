"""Every SM_* variable the script sees equals the one sagemaker-training computes for the
same /opt/ml tree, except the deliberate differences listed in docs/using.md."""

import json
import subprocess

import pytest

from support.jobtree import PYTHON, entrypoint_env, run_entrypoint, write_tree

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

DUMP_ENV = """
import json, os, sys
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "env.json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv[1:]}, f)
"""

HYPERPARAMETERS = {
    "learning-rate": 0.05,
    "epochs": 3,
    "layers": [64, "relu", 32],
    "use-amp": True,
    "optimizer": {"name": "sgd", "momentum": 0.9},
    "note": "plain text",
    "x": "one-letter",
    "nothing": None,
    "sagemaker_container_log_level": 20,
    "sagemaker_job_name": "parity-job",
    "sagemaker_region": "eu-west-1",
}
CHANNELS = {
    "train": {"TrainingInputMode": "File", "S3DistributionType": "ShardedByS3Key", "ContentType": "application/x-npy"},
    "validation": {"TrainingInputMode": "FastFile", "S3DistributionType": "FullyReplicated"},
    "test-set": {"TrainingInputMode": "File"},
}
HETERO = {
    "current_instance_type": "ml.c5.xlarge",
    "current_group_name": "data",
    "network_interface_name": "lo",  # exists on every machine: no interface fallback here
    "instance_groups": [
        {"instance_group_name": "train", "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-1", "algo-2"]},
        {"instance_group_name": "data", "instance_type": "ml.c5.xlarge", "hosts": ["algo-3"]},
    ],
}

SHAPES = {
    # algo-3 is outside the distribution group "train": it runs the script once (toolkit rule)
    "heterogeneous": dict(
        hosts=("algo-1", "algo-2", "algo-3"),
        current_host="algo-3",
        resource_extra=HETERO,
        extra_hps={"sagemaker_distribution_instance_groups": ["train"], "sagemaker_torch_distributed_enabled": True},
    ),
    "homogeneous": dict(
        hosts=("algo-1",),
        current_host="algo-1",
        resource_extra={"network_interface_name": "lo"},
        extra_hps={},
    ),
}

# Deliberate differences: name -> what ours must be instead.
EXPECTED_ARGV = [
    "--epochs", "3",
    "--layers", '[64,"relu",32]',
    "--learning-rate", "0.05",
    "--note", "plain text",
    "--nothing", "null",
    "--optimizer", '{"name":"sgd","momentum":0.9}',
    "--use-amp", "true",
    "-x", "one-letter",
]


def toolkit_env(root):
    code = (
        "import json; from sagemaker_training import environment; "
        "print(json.dumps(environment.Environment().to_env_vars()))"
    )
    done = subprocess.run(
        [PYTHON, "-c", code], env=entrypoint_env(root), capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_sm_variable_matches_the_toolkit(tmp_path, shape):
    spec = SHAPES[shape]
    root = write_tree(
        tmp_path / "ml",
        hosts=spec["hosts"],
        current_host=spec["current_host"],
        hyperparameters={**HYPERPARAMETERS, **spec["extra_hps"]},
        channels=CHANNELS,
        resource_extra=spec["resource_extra"],
        script=DUMP_ENV,
    )
    (root / "output/data").mkdir(parents=True)
    theirs = toolkit_env(root)

    done = run_entrypoint(root, TRAINING_JOB_NAME="parity-job")
    assert done.returncode == 0, done.stderr
    seen = json.loads((root / "output/data/env.json").read_text())
    ours = {k: v for k, v in seen["env"].items() if k.startswith("SM_")}

    assert seen["argv"] == EXPECTED_ARGV
    assert json.loads(ours.pop("SM_USER_ARGS")) == EXPECTED_ARGV
    toolkit_args = json.loads(theirs.pop("SM_USER_ARGS"))
    assert toolkit_args[toolkit_args.index("--use-amp") + 1] == "True"  # the complaint we fix

    ours_training_env = json.loads(ours.pop("SM_TRAINING_ENV"))
    theirs_training_env = json.loads(theirs.pop("SM_TRAINING_ENV"))
    assert theirs_training_env.pop("job_name") is None  # toolkit process had no TRAINING_JOB_NAME
    assert ours_training_env.pop("job_name") == "parity-job"
    assert ours_training_env == theirs_training_env

    assert sorted(ours) == sorted(theirs)
    for name in sorted(theirs):
        assert ours[name] == theirs[name], name



"""Neuron's compile cache kept between jobs (entrypoint/decide/neuron_env.py): in the job's
checkpoint folder, which SageMaker syncs to checkpoint_s3_uri, unless the job names its own;
with neuron_parallel_compile too. The plan's env and notes, and `train --dry-run` on a stand-in
neuron-ls (no Trainium here)."""

from __future__ import annotations

import json
import os

import pytest

from entrypoint.decide.neuron_env import build_neuron_cache_env, parse_cache_dir_flag
from entrypoint.decide.plan import LAUNCH_TORCHRUN
from entrypoint.decide.plan import RECORD_ERRORS as RE
from entrypoint.job.config import CheckpointConfig
from support.jobs import GPU8_EFA, PY, TRN1_EFA, make_job, plan_for
from support.jobtree import run_entrypoint, write_tree

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

CKPT = CheckpointConfig(local_path="/opt/ml/checkpoints", s3_uri="s3://bucket/run-1/checkpoints")
TORCH = {"sagemaker_torch_distributed_enabled": True}
CACHE = "/opt/ml/checkpoints/neuron-compile-cache"


def neuron_env(plan) -> dict[str, str]:
    return {k: v for k, v in plan.env if k.startswith("NEURON_") and k != "NEURON_RT_ROOT_COMM_ID"}


def cache_notes(plan) -> list[str]:
    return [n for n in plan.notes if n.startswith("Neuron compile cache")]


def test_the_cache_goes_in_the_checkpoint_folder_and_the_plan_says_where_it_is_kept():
    plan = plan_for(make_job(hps=TORCH, checkpoint=CKPT), TRN1_EFA)
    assert neuron_env(plan) == {"NEURON_COMPILE_CACHE_URL": CACHE, "NEURON_CC_FLAGS": "--retry_failed_compilation"}
    [note] = cache_notes(plan)
    assert note.startswith(f"Neuron compile cache: {CACHE}, in the checkpoint folder, which SageMaker keeps in "
                           f"s3://bucket/run-1/checkpoints for the next job")


def test_the_checkpoint_folders_own_local_path_is_followed():
    plan = plan_for(make_job(hps=TORCH, checkpoint=CKPT._replace(local_path="/data/ckpt")), TRN1_EFA)
    assert plan.env_dict["NEURON_COMPILE_CACHE_URL"] == "/data/ckpt/neuron-compile-cache"


def test_the_jobs_own_compiler_flags_are_kept_and_the_retry_flag_added_once():
    plan = plan_for(make_job(hps=TORCH, checkpoint=CKPT, environ={"NEURON_CC_FLAGS": "--model-type=transformer -O1"}),
                    TRN1_EFA)
    assert plan.env_dict["NEURON_CC_FLAGS"] == "--model-type=transformer -O1 --retry_failed_compilation"
    plan = plan_for(make_job(hps=TORCH, checkpoint=CKPT, environ={"NEURON_CC_FLAGS": "--retry_failed_compilation"}),
                    TRN1_EFA)
    assert neuron_env(plan) == {"NEURON_COMPILE_CACHE_URL": CACHE}  # the job's value, untouched


@pytest.mark.parametrize("environ, named", [
    ({"NEURON_COMPILE_CACHE_URL": "s3://my-bucket/neuron-cache"}, "NEURON_COMPILE_CACHE_URL=s3://my-bucket/neuron-cache"),
    ({"NEURON_CC_FLAGS": "-O1 --cache_dir=/fsx/cache"}, "--cache_dir=/fsx/cache in NEURON_CC_FLAGS"),
    ({"NEURON_CC_FLAGS": "--cache_dir /fsx/cache"}, "--cache_dir=/fsx/cache in NEURON_CC_FLAGS"),
])  # fmt: skip
def test_a_cache_the_job_names_itself_wins(environ, named):
    plan = plan_for(make_job(hps=TORCH, checkpoint=CKPT, environ=environ), TRN1_EFA)
    assert neuron_env(plan) == {}  # nothing added, nothing overridden
    [note] = cache_notes(plan)
    assert note == f"Neuron compile cache: the job's own, {named}."


def test_without_a_checkpoint_folder_the_plan_says_the_cache_is_lost():
    plan = plan_for(make_job(hps=TORCH), TRN1_EFA)
    assert neuron_env(plan) == {}
    [note] = cache_notes(plan)
    assert "/var/tmp/neuron-compile-cache, lost when the job ends" in note and "checkpoint_s3_uri" in note


def test_no_neuron_no_cache_settings():
    for facts in (GPU8_EFA, TRN1_EFA._replace(neuron_core_count=0)):
        plan = plan_for(make_job(hps=TORCH, checkpoint=CKPT), facts)
        assert neuron_env(plan) == {} and cache_notes(plan) == []


def test_neuron_parallel_compile_fills_the_same_cache_the_next_job_trains_with():
    job = make_job(hosts=("algo-1", "algo-2"), hps=TORCH, checkpoint=CKPT, environ={"RUN_NEURON_PARALLEL_COMPILE": "1"})
    plan = plan_for(job, TRN1_EFA)
    assert plan.processes[0].argv[:3] == ("neuron_parallel_compile", PY, LAUNCH_TORCHRUN)
    assert plan.processes[0].argv[-2:] == (RE, "/opt/ml/code/train.py")
    # The plan's env is every process's: neuron_parallel_compile reads the cache from it.
    assert plan.env_dict["NEURON_COMPILE_CACHE_URL"] == CACHE
    [note] = cache_notes(plan)
    assert "neuron_parallel_compile (RUN_NEURON_PARALLEL_COMPILE=1) compiles this job's graphs into it" in note
    # The training job after it: the same folder, so the graphs come from the cache.
    after = plan_for(make_job(hosts=("algo-1", "algo-2"), hps=TORCH, checkpoint=CKPT), TRN1_EFA)
    assert after.processes[0].argv[0] == PY and after.env_dict["NEURON_COMPILE_CACHE_URL"] == CACHE


def test_mpi_ranks_on_every_host_get_the_cache_by_name():
    job = make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_mpi_enabled": True}, checkpoint=CKPT)
    argv = plan_for(job, TRN1_EFA).processes[0].argv
    assert argv[0] == "mpirun"
    forwarded = {argv[i + 1] for i, word in enumerate(argv) if word == "-x"}
    assert {"NEURON_COMPILE_CACHE_URL", "NEURON_CC_FLAGS"} <= forwarded
    assert CACHE not in argv  # by name, never the value


def test_the_cache_dir_flag_parser():
    assert parse_cache_dir_flag("--cache_dir=s3://b/p -O1") == "s3://b/p"
    assert parse_cache_dir_flag("-O1 --cache_dir /x") == "/x"
    assert parse_cache_dir_flag("--no_cache") is None
    assert parse_cache_dir_flag("--xcache_dir=/x") is None
    assert build_neuron_cache_env({}, 0, False, CKPT) == ({}, [])


def test_dry_run_on_a_trainium_host_with_a_checkpoint_folder(tmp_path):
    """The whole read → decide path: checkpointconfig.json read, neuron-ls (a stand-in) says 2
    Neuron cores, the plan's env carries the cache and its note goes to the log."""
    root = write_tree(tmp_path / "ml", hyperparameters=TORCH, script="print('hi')\n")
    local = tmp_path / "ckpt"
    (root / "input/config/checkpointconfig.json").write_text(
        json.dumps({"LocalPath": str(local), "S3Uri": "s3://bucket/run-1/checkpoints"}))
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "neuron-ls").write_text("#!/bin/sh\necho '[{\"neuron_device\": 0, \"nc_count\": 2}]'\n")
    (tools / "neuron-ls").chmod(0o755)
    done = run_entrypoint(root, "--dry-run", PATH=f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)["env"]
    assert env["NEURON_COMPILE_CACHE_URL"] == f"{local}/neuron-compile-cache"
    assert env["NEURON_CC_FLAGS"] == "--retry_failed_compilation"
    assert f"note: Neuron compile cache: {local}/neuron-compile-cache, in the checkpoint folder" in done.stderr

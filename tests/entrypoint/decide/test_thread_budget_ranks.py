"""The plan's thread budget reaches the ranks under each launcher (real processes, no mocks):
each rank writes the OMP_NUM_THREADS it sees, the test reads what they wrote. The entrypoint
runs under `taskset` so that the cores it may use, and so the budget, are known."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

import pytest

from support.jobtree import PYTHON, REPO, entrypoint_env, write_tree

TASKSET = shutil.which("taskset")
CORES = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(TASKSET is None or len(CORES) < 2,
                                     reason="needs taskset (util-linux) and 2 cores to pin the entrypoint to")

# Each rank writes what it saw to model/<rank>.json (the model folder: shared by every rank here).
WRITE_SEEN = """
import json, os
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("RANK") or "0"
seen = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump(seen, f)
"""
# A parameter-server worker joins the rpc group, or the host's shard waits for it.
PS_WORKER = WRITE_SEEN.replace('"RANK"', '"BYOC_WORKER_RANK"') + """
import torch.distributed.rpc as rpc
from train.ps import build_rpc_options, parse_ps_topology
topology = parse_ps_topology(os.environ)
rpc.init_rpc(topology.rpc_name, rank=topology.rank, world_size=topology.world_size,
             rpc_backend_options=build_rpc_options(topology))
rpc.shutdown()
"""


def run_pinned(tmp_path, cores: int, hyperparameters: dict, script: str = WRITE_SEEN, **env: str) -> dict:
    """Runs the job on this host with the entrypoint pinned to `cores` cores; {rank file: what it saw}."""
    host = socket.gethostname()  # mpirun then starts every rank here, without SSH
    root = write_tree(tmp_path, script=script, program="job.py", hosts=(host,), current_host=host, hyperparameters=hyperparameters,
                      resource_extra={"current_instance_type": "ml.c5.xlarge"})
    pinned = ",".join(map(str, CORES[:cores]))
    done = subprocess.run([TASKSET, "-c", pinned, PYTHON, "-m", "entrypoint", "train"],
                          env=entrypoint_env(root, BYOC_REPORT="0", **env), capture_output=True, text=True,
                          timeout=120, cwd=str(REPO))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {p.name: json.loads(p.read_text()) for p in sorted((root / "model").glob("rank-*.json"))}


@needs_two_cores
def test_one_process_takes_every_core_it_may_use(tmp_path):
    assert run_pinned(tmp_path, 1, {}) == {"rank-0.json": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": None}}
    assert run_pinned(tmp_path / "two", 2, {})["rank-0.json"]["OMP_NUM_THREADS"] == "2"


@needs_two_cores
@pytest.mark.parametrize("own", [None, "3"])
def test_mpirun_ranks_get_the_share_or_the_jobs_own_value(tmp_path, own):
    pytest.importorskip("mpi4py", reason="mpi4py is part of the test environment (pyproject's test extra)")
    env = {"OMP_NUM_THREADS": own} if own else {}
    seen = run_pinned(tmp_path, 2, {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2},
                      **env)
    expected = own or "1"  # 2 cores, 2 ranks
    assert seen == {f"rank-{r}.json": {"OMP_NUM_THREADS": expected, "MKL_NUM_THREADS": None} for r in (0, 1)}


@pytest.mark.slow  # torchrun imports torch
@needs_two_cores
def test_torchrun_ranks_get_the_share(tmp_path):
    # No GPU: one rank per host, where torchrun itself would leave OMP_NUM_THREADS unset.
    seen = run_pinned(tmp_path, 2, {"sagemaker_torch_distributed_enabled": True})
    assert seen == {"rank-0.json": {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": None}}


@pytest.mark.slow  # the shard and the worker import torch
@needs_two_cores
def test_parameter_server_workers_share_the_cores_with_the_hosts_shard(tmp_path):
    seen = run_pinned(tmp_path, 2, {"sagemaker_parameter_server_enabled": True}, script=PS_WORKER)
    assert seen == {"rank-0.json": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": None}}  # 1 worker + the shard

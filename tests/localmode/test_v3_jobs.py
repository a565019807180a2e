"""Real SageMaker Python SDK v3 jobs (sagemaker==3.27.0, the sdk-v3 extra, in .venv-sdk-v3):
`ModelTrainer(training_mode=Mode.LOCAL_CONTAINER, training_image=<this tree's image>,
compute=Compute(instance_type="local_cpu", instance_count=N))` with Torchrun(), MPI() and
no distributed config. v3 bypasses our ENTRYPOINT (its `bash -c` sm_train.sh and drivers run);
each rank writes what it got into /opt/ml/model, which v3 collects from every host into
compressed_artifacts/model.tar.gz, and the test checks the values there.

Run: BYOC_IMAGE_TAG=byoc-training:<tag> .venv/bin/python -m pytest tests/localmode/test_v3_jobs.py -s
(-s prints each job's train() time.)"""

from __future__ import annotations

import os
import shutil

import pytest

from localmode.v3_harness import V3JobResult, probe_sdk_v3_python, run_build_image, run_v3_job
from support.docker import decide_image_tag

pytestmark = pytest.mark.slow

MPI_SCRIPT = r'''
import argparse, json, socket
from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--fail_rank", type=int, default=-1)
parser.add_argument("--tag", default="")
args, _ = parser.parse_known_args()

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
host = json.load(open("/opt/ml/input/config/resourceconfig.json"))["current_host"]
if rank == args.fail_rank:
    raise RuntimeError(f"boom-v3-mpi from rank {rank} on {host}")

def read(path):
    try:
        return open(path).read()
    except OSError:
        return None

total = comm.allreduce(rank + 1, op=MPI.SUM)
record = {
    "rank": rank, "size": size, "host": host, "allreduce": total, "hosts": comm.allgather(host),
    "address": socket.gethostbyname(host), "tag": args.tag,
    "authorized_keys": read("/root/.ssh/authorized_keys"),
    "host_key": read("/dev/shm/byoc-sshd/ssh_host_ed25519_key.pub"),
}
with open(f"/opt/ml/model/mpi-rank-{rank}.json", "w") as f:
    json.dump(record, f)
'''

TORCH_SCRIPT = r'''
import argparse, json, os, sys
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fail_rank", type=int, default=-1)
args, _ = parser.parse_known_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
host = json.load(open("/opt/ml/input/config/resourceconfig.json"))["current_host"]
if rank == args.fail_rank:
    raise RuntimeError(f"boom-v3-torchrun from rank {rank} on {host}")
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
with open(f"/opt/ml/model/torchrun-rank-{rank}.json", "w") as f:
    json.dump({"rank": rank, "world": world, "host": host, "allreduce": t.item(),
               "master": os.environ.get("MASTER_ADDR"), "argv": sys.argv[1:]}, f)
dist.destroy_process_group()
'''

PLAIN_SCRIPT = r'''
import json, os, sys
with open("/opt/ml/model/plain.json", "w") as f:
    json.dump({"argv": sys.argv[1:], "host": os.environ.get("SM_CURRENT_HOST"),
               "hps": json.loads(os.environ.get("SM_HPS", "{}")),
               "path": os.environ.get("PATH"), "v3_mpi": os.environ.get("BYOC_SDK_V3_MPI")}, f)
print("plain script done")
'''


@pytest.fixture(scope="module")
def image() -> str:
    if probe_sdk_v3_python() is None:
        pytest.fail(".venv-sdk-v3 is missing: scripts/bootstrap.sh installs the SDK v3 pin (pyproject's sdk-v3 extra)")
    if shutil.which("docker") is None and os.geteuid() != 0:
        pytest.skip("no docker CLI and not root: scripts/docker-engine.sh cannot install the engine")
    return run_build_image(decide_image_tag(os.environ))


def _report(name: str, result: V3JobResult) -> None:
    print(f"\n{name}: train() {result.train_seconds} s, driver {result.wall_seconds} s, containers {result.exit_codes}")


def test_one_host_plain_script(image, tmp_path):
    result = run_v3_job(tmp_path, image, {"train.py": PLAIN_SCRIPT}, hyperparameters={"epochs": 3, "name": "a b"})
    _report("1 host, no distributed", result)
    assert result.ok, result.log_tail()
    got = result.model_json("plain.json")
    assert got["argv"] == ["--epochs", "3", "--name", "a b"] and got["hps"] == {"epochs": 3, "name": "a b"}
    assert got["host"] == "algo-1"
    # not an MPI job: no shim on PATH, no trust helper
    assert got["v3_mpi"] == "0" and "sdk-v3" not in got["path"]
    assert "byoc sdk-v3" not in result.log


def test_two_hosts_torchrun_allreduce(image, tmp_path):
    result = run_v3_job(tmp_path, image, {"train.py": TORCH_SCRIPT}, instance_count=2,
                        distributed={"kind": "torchrun", "process_count_per_node": 1})
    _report("2 hosts, Torchrun()", result)
    assert result.ok, result.log_tail()
    ranks = result.model_jsons("torchrun-rank-")
    assert [(r["rank"], r["world"], r["host"]) for r in ranks] == [(0, 2, "algo-1"), (1, 2, "algo-2")]
    assert {r["allreduce"] for r in ranks} == {3.0}


def test_two_hosts_mpi_allreduce_over_per_job_ssh_trust(image, tmp_path):
    result = run_v3_job(tmp_path, image, {"train.py": MPI_SCRIPT}, instance_count=2,
                        distributed={"kind": "mpi", "process_count_per_node": 2}, hyperparameters={"tag": "v3"})
    _report("2 hosts x 2, MPI()", result)
    assert result.ok, result.log_tail()
    ranks = result.model_jsons("mpi-rank-")
    # hosts x processes per host: v3 alone would start 2 ranks, both on algo-1
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], result.log_tail()
    assert {r["size"] for r in ranks} == {4} and {r["allreduce"] for r in ranks} == {1 + 2 + 3 + 4}
    assert sorted(r["host"] for r in ranks) == ["algo-1", "algo-1", "algo-2", "algo-2"]
    assert {r["tag"] for r in ranks} == {"v3"}
    assert "byoc sdk-v3 mpirun: -np 2 -> 4" in result.log
    assert "byoc sdk-v3 mpirun: btl_tcp_if_include ethwe -> eth0" in result.log

    # The trust: the leader authorized algo-2's own host key from algo-2's address, and only
    # that; algo-2 authorized the leader's, from the leader's address.
    by_host = {r["host"]: r for r in ranks}
    leader, worker = by_host["algo-1"], by_host["algo-2"]
    assert leader["host_key"] != worker["host_key"]

    def line(peer):
        return f'from="{peer["address"]}",restrict {" ".join(peer["host_key"].split()[:2])} byoc-sdk-v3:{peer["host"]}'

    assert leader["authorized_keys"].splitlines() == [line(worker)]
    assert worker["authorized_keys"].splitlines() == [line(leader)]


@pytest.mark.parametrize(
    "kind, script, program",
    [("mpi", MPI_SCRIPT, "boom-v3-mpi"), ("torchrun", TORCH_SCRIPT, "boom-v3-torchrun")],
)
def test_a_rank_that_raises_fails_the_job_within_a_minute_with_the_exception_in_the_log(image, tmp_path, kind, script, program):
    """The last rank (on algo-2) raises before the collective its peers are blocked in."""
    per_host = 2 if kind == "mpi" else 1
    result = run_v3_job(tmp_path, image, {"train.py": script}, instance_count=2,
                        distributed={"kind": kind, "process_count_per_node": per_host},
                        hyperparameters={"fail_rank": 2 * per_host - 1}, timeout_s=240)
    _report(f"2 hosts, {kind}, rank raises", result)
    assert not result.ok and not result.timed_out, result.log_tail()
    assert result.error_type == "RuntimeError" and "exited with code" in result.error
    assert f"RuntimeError: {program} from rank {2 * per_host - 1} on algo-2" in result.log
    assert result.train_seconds < 60, result.log_tail()


def test_command_train_hands_the_job_to_our_launcher(image, tmp_path):
    """`SourceCode(command="train")`: v3's sm_train.sh runs `train` (the image's
    /usr/local/byoc/bin/train, i.e. our entrypoint) instead of its drivers; our launcher reads
    the launcher keys from hyperparameters.json, copies the code from v3's `code` channel and
    runs torchrun on both hosts (the ethwe interface falling back to eth0)."""
    result = run_v3_job(
        tmp_path, image, {"train.py": TORCH_SCRIPT}, instance_count=2, command="train",
        hyperparameters={"sagemaker_program": "train.py", "sagemaker_submit_directory": "/opt/ml/input/data/code",
                         "sagemaker_torch_distributed_enabled": True, "epochs": 2},
    )
    _report("2 hosts, command=train (our launcher, torchrun)", result)
    assert result.ok, result.log_tail()
    assert "[entrypoint] algo-1: running torchrun on 2 host(s)" in result.log
    assert 'network interface "ethwe" does not exist here; using eth0' in result.log
    ranks = result.model_jsons("torchrun-rank-")
    assert [(r["rank"], r["world"], r["host"], r["allreduce"]) for r in ranks] == [(0, 2, "algo-1", 3.0), (1, 2, "algo-2", 3.0)]
    # the user's hyperparameters reach the script as arguments, from hyperparameters.json
    assert {tuple(r["argv"]) for r in ranks} == {("--epochs", "2")}

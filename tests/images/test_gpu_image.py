"""The GPU image as built (Dockerfile.gpu), checked where it ships: its own Python, packages and
launcher, in `docker run`. The image is built by scripts/check-gpu-image.sh (tens of minutes
uncached on 2 cores, so not in CI's run), which runs this module with BYOC_TEST_IMAGE naming it:

    BYOC_TEST_IMAGE=byoc-training:gpu-local scripts/run-tests.sh tests/images/test_gpu_image.py

Without a GPU: what needs the driver (libcuda.so.1) is checked by scripts/gpu_smoke.py on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.images.image_harness import REPO_ROOT, build_run_argv, ensure_engine, probe_image_config, run_docker
from support.jobtree import write_tree

IMAGE = os.environ.get("BYOC_TEST_IMAGE", "")


def _gpu_image_or_skip() -> str:
    if not IMAGE:
        pytest.skip("no GPU image named: scripts/check-gpu-image.sh builds one and runs this module with "
                    "BYOC_TEST_IMAGE=<its tag> (the build takes tens of minutes, outside CI)")
    ensure_engine()
    labels = probe_image_config(IMAGE)["Config"].get("Labels") or {}
    if "(gpu)" not in labels.get("org.opencontainers.image.title", ""):
        pytest.skip(f"BYOC_TEST_IMAGE={IMAGE} is not the gpu flavour (title {labels.get('org.opencontainers.image.title')!r})")
    return IMAGE


@pytest.fixture(scope="module")
def gpu_image() -> str:
    return _gpu_image_or_skip()


def _in_image(image: str, *command: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    argv = build_run_argv(image, entrypoint=command[0], command=command[1:], options=("-i", "--network", "none"))
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=600)


def test_the_stack_checks_pass_with_the_images_own_python(gpu_image):
    script = (REPO_ROOT / "docker/scripts/check-gpu-stack.py").read_text()
    done = _in_image(gpu_image, "python3", "-", stdin=script)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "Horovod built with NCCL yes, MPI yes, Gloo yes" in out
    assert "torch loads cuDNN 9" in out and "torch loads NCCL 2." in out
    assert "mpi4py loads Open MPI v4." in out
    assert "on a GPU only: torch.cuda.is_available() is False here" in out


def test_the_build_versions_file_names_cuda_nccl_torch_and_no_efa(gpu_image):
    done = _in_image(gpu_image, "cat", "/etc/byoc/build-versions.env")
    values = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert values["EFA_INSTALLER"] == "none" and "LIBFABRIC" not in values
    assert values["CUDA"].startswith("13.0.") and values["TORCH"].startswith("2.13.0")
    nccl = _in_image(gpu_image, "python3", "-c", "import torch; print('.'.join(map(str, torch.cuda.nccl.version())))")
    assert values["NCCL"] == nccl.stdout.strip()


def test_horovod_and_mpi4py_load_without_a_driver_and_two_ranks_talk(gpu_image):
    """Horovod's NCCL build links the CUDA runtime, not the driver: it imports on a machine
    without one. mpi4py's two ranks run under the image's mpirun. Each rank's line is one
    write: print's pieces from two ranks reached mpirun's output interleaved ("rankrank 1 sum 3"
    and " 0 sum 3", once, on a loaded machine)."""
    done = _in_image(gpu_image, "mpirun", "--oversubscribe", "-np", "2", "-mca", "btl", "self,vader",
                     "python3", "-c", "import os; import horovod.torch as hvd; from mpi4py import MPI; "
                     "c = MPI.COMM_WORLD; s = c.allreduce(c.Get_rank() + 1); "
                     "os.write(1, f'rank {c.Get_rank()} sum {s}\\n'.encode())")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n")[:2]) == ["rank 0 sum 3", "rank 1 sum 3"]


def _p4d_tree(root: Path) -> Path:
    return write_tree(root, hosts=("algo-1", "algo-2"), script="print('x')\n",
                      hyperparameters={"sagemaker_torch_distributed_enabled": True},
                      resource_extra={"current_instance_type": "ml.p4d.24xlarge", "network_interface_name": "eth0"})


def test_dry_run_on_two_p4d_hosts_plans_eight_ranks_nccl_and_the_efa_verdict(gpu_image, tmp_path):
    """2 x ml.p4d.24xlarge as the launcher in the image sees it: a stand-in nvidia-smi lists 8 GPUs
    (the A100s of a p4d); no EFA device shows (none here) and the image was built without EFA."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\n" + "".join(
        f"echo 'GPU {i}: NVIDIA A100-SXM4-40GB (UUID: GPU-0000000{i})'\n" for i in range(8)))
    (tools / "nvidia-smi").chmod(0o755)
    root = _p4d_tree(tmp_path / "ml")
    # SageMaker sizes /dev/shm from the instance; Docker's 64 MB would be a finding of its own.
    ran = run_docker(build_run_argv(gpu_image, mounts=[(root, "/opt/ml"), (tools, "/usr/local/nvidia/bin")],
                                    hostname="algo-1", command=["train", "--dry-run"], options=("--shm-size=2g",)))
    assert ran.returncode == 0, ran.stderr
    plan = json.loads(ran.stdout)
    assert plan["launcher"] == "torch_distributed" and plan["processes_per_host"] == 8
    torchrun = plan["processes"][0]["argv"]
    assert torchrun[torchrun.index("--nproc_per_node") + 1] == "8" and torchrun[torchrun.index("--nnodes") + 1] == "2"
    env = plan["env"]
    assert env["SM_NUM_GPUS"] == "8" and env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_NET_PLUGIN"] == "none"  # no EFA device: NCCL's own sockets, the plugin not loaded
    assert any(n.startswith("NCCL network: TCP sockets on eth0; no EFA device here") and "image built with NCCL" in n
               for n in plan["notes"])
    verdict = plan["preflight"]
    assert [f["fatal"] for f in verdict] == [True, False]
    assert "shows none of its 4 EFA devices" in verdict[0]["text"]
    assert "this image was built without EFA (GPU_EFA_INSTALLER_VERSION=none" in verdict[1]["text"]


def test_the_image_is_at_most_10_gb_uncompressed(gpu_image):
    """Half of the AWS PyTorch DLC's 15-20 GB: SageMaker pulls the image on every instance at
    every start (docs/gpu-image.md: where the bytes go)."""
    size = int(probe_image_config(gpu_image)["Size"])
    assert size <= 10_000_000_000, f"{size / 1e9:.2f} GB"
